"""The wait-for graph on hand-built positions: chains, several roots, cycles, p2p, ranks without data."""

from __future__ import annotations

from comm2perfetto.diagnose.waits import (
    COLLECTIVE,
    CYCLE,
    DEAD,
    EXITED,
    FROZEN,
    NO_DATA,
    OPERATION,
    OUTSIDE,
    RANK,
    RECV,
    SEND,
    Op,
    Position,
    explain,
    precedes,
    recent_by_group,
    waits_of,
)


def coll(group: str, seq: int, name: str = "all_reduce") -> Op:
    return Op(group, COLLECTIVE, seq, name)


def _roots(graph) -> list[tuple]:
    return [(r.kind, r.culprits, r.suspects) for r in graph.roots]


def _graph(positions: dict[int, Position], members: dict[str, tuple[int, ...]], order=None):
    return explain({r: p.state for r, p in positions.items()}, waits_of(positions, members), order)


def test_one_rank_outside_is_the_root_of_every_wait_on_it():
    positions = {0: Position(0, "blocked", (coll("0", 4),), {"0": 4}),
                 1: Position(1, "blocked", (coll("0", 4),), {"0": 4}),
                 2: Position(2, OUTSIDE, (), {"0": 3})}
    g = _graph(positions, {"0": (0, 1, 2)})
    assert _roots(g) == [(RANK, (2,), ())]
    (w,) = g.waits
    assert (w.blocked, w.waits_for) == ((0, 1), (2,))
    assert g.blocked_by(w) == [0]


def test_a_chain_across_groups_ends_at_the_rank_outside():
    # 0 waits in group a for 1; 1 is blocked in group b waiting for 2; 2 loads data.
    positions = {0: Position(0, "blocked", (coll("a", 2),), {"a": 2}),
                 1: Position(1, "blocked", (coll("b", 7),), {"a": 1, "b": 7}),
                 2: Position(2, OUTSIDE, (), {"b": 6})}
    g = _graph(positions, {"a": (0, 1), "b": (1, 2)})
    assert _roots(g) == [(RANK, (2,), ())]
    wait_a = next(w for w in g.waits if w.op.group == "a")
    assert wait_a.waits_for == (1,)
    assert g.blocked_by(wait_a) == [0]  # through rank 1, blocked itself


def test_several_roots_each_named_once():
    positions = {0: Position(0, "blocked", (coll("a", 1),), {"a": 1}),
                 1: Position(1, EXITED, (), {"a": 0}),
                 2: Position(2, "blocked", (coll("b", 3),), {"b": 3}),
                 3: Position(3, FROZEN, (), {"b": 2}),
                 4: Position(4, "blocked", (coll("c", 1),), {"c": 1}),
                 5: Position(5, DEAD, (), {"c": 0})}
    g = _graph(positions, {"a": (0, 1), "b": (2, 3), "c": (4, 5)})
    assert sorted(_roots(g)) == [(RANK, (1,), ()), (RANK, (3,), ()), (RANK, (5,), ())]


def test_a_rank_without_data_is_a_suspect_never_a_culprit():
    positions = {0: Position(0, "blocked", (coll("0", 5),), {"0": 5}),
                 1: Position(1, "blocked", (coll("0", 5),), {"0": 5})}
    g = _graph(positions, {"0": (0, 1, 2)})  # rank 2 reported nothing
    assert _roots(g) == [(RANK, (), (2,))]


def test_a_frozen_member_that_reached_the_collective_is_still_waited_for():
    positions = {0: Position(0, "blocked", (coll("0", 5),), {"0": 5}),
                 1: Position(1, FROZEN, (), {"0": 5})}
    g = _graph(positions, {"0": (0, 1)})
    assert _roots(g) == [(RANK, (1,), ())]


def test_every_member_in_it_is_a_root_operation():
    positions = {r: Position(r, "blocked", (coll("0", 3),), {"0": 3}) for r in range(3)}
    g = _graph(positions, {"0": (0, 1, 2)})
    assert _roots(g) == [(OPERATION, (), ())]
    assert g.roots[0].wait.blocked == (0, 1, 2)


def _mesh_positions() -> dict[int, Position]:
    """2x2 mesh, tp = [0,1] [2,3], dp = [0,2] [1,3]; rank 3 skipped tp #5 and went on to dp #5 (done with 1)
    and the default group's #5. Each rank's history: tp, dp, default, one each per step, 10 ms apart."""
    def hist(rank: int, upto: dict[str, int]) -> dict[str, list[tuple[int, int]]]:
        offset = {"tp": 0, "dp": 3, "0": 6}
        out = {}
        for g, n in upto.items():
            name = {"tp": f"tp{rank // 2}", "dp": f"dp{rank % 2}", "0": "0"}[g]
            out[name] = [(s, s * 10 + offset[g]) for s in range(1, n + 1)]
        return out

    def pos(rank, op, upto, recent=None):
        names = {"tp": f"tp{rank // 2}", "dp": f"dp{rank % 2}", "0": "0"}
        return Position(rank, "blocked", (coll(names[op], 5),), {names[g]: n for g, n in upto.items()},
                        recent or hist(rank, upto))

    skipped = hist(3, {"tp": 4, "dp": 5, "0": 5})
    skipped["dp1"][-1] = (5, 41)  # dp #5 and default #5 right after default #4 (tp #5 skipped)
    skipped["0"][-1] = (5, 42)
    return {0: pos(0, "dp", {"tp": 5, "dp": 5, "0": 4}),
            1: pos(1, "0", {"tp": 5, "dp": 5, "0": 5}),
            2: pos(2, "tp", {"tp": 5, "dp": 4, "0": 4}),
            3: pos(3, "0", {"tp": 4, "dp": 5, "0": 5}, skipped)}


MESH = {"tp0": (0, 1), "tp1": (2, 3), "dp0": (0, 2), "dp1": (1, 3), "0": (0, 1, 2, 3)}


def _history_order(positions):
    def order(rank, first, then):
        recent = positions[rank].recent
        if first.kind != COLLECTIVE or then.kind != COLLECTIVE:
            return None
        return precedes(recent.get(first.group, ()), recent.get(then.group, ()), first.seq, then.seq)
    return order


def test_a_cross_group_order_deviation_is_one_cycle_whose_deviating_rank_is_named():
    positions = _mesh_positions()
    g = _graph(positions, MESH, _history_order(positions))
    (root,) = g.roots
    assert (root.kind, root.culprits, root.waits_for) == (CYCLE, (3,), (0, 2, 3))
    skipped, went_to = root.deviations[3]
    assert (skipped.op.group, skipped.op.seq, skipped.blocked) == ("tp1", 5, (2,))
    assert (went_to.op.group, went_to.op.seq) == ("0", 5)
    for w in g.waits:  # every wait leads to the cycle, rank 1's (outside it) too
        assert g.blocked_by(w) == [0]


def test_a_cycle_without_history_names_no_culprit_and_its_ranks_as_suspects():
    positions = _mesh_positions()
    g = _graph(positions, MESH, order=None)
    (root,) = g.roots
    assert (root.kind, root.culprits, root.suspects) == (CYCLE, (), (0, 2, 3))


def test_pipeline_a_rank_blocked_in_p2p_waits_and_the_peer_that_went_to_a_collective_deviates():
    # 0 sends to 1; 1 receives from 2; 2 sent nothing and waits in all_reduce #1.
    positions = {0: Position(0, "blocked", (Op("0", SEND, None, "send", peer=1),), {"0": 0}),
                 1: Position(1, "blocked", (Op("0", RECV, None, "recv", peer=2),), {"0": 0}),
                 2: Position(2, "blocked", (coll("0", 1),), {"0": 1})}
    g = _graph(positions, {"0": (0, 1, 2)})
    (root,) = g.roots
    assert (root.kind, root.culprits, root.waits_for) == (CYCLE, (2,), (0, 1, 2))
    assert root.wait.op.kind == RECV and root.wait.blocked == (1,)
    send = next(w for w in g.waits if w.op.kind == SEND)
    assert (send.blocked, send.waits_for, g.blocked_by(send)) == ((0,), (1,), [0])


def test_a_transfer_both_sides_are_in_is_one_operation():
    positions = {0: Position(0, "blocked", (Op("0", SEND, None, "send", peer=1),)),
                 1: Position(1, "blocked", (Op("0", RECV, None, "recv", peer=0),))}
    g = _graph(positions, {"0": (0, 1)})
    (w,) = g.waits
    assert (w.blocked, w.waits_for) == ((0, 1), ())
    assert _roots(g) == [(OPERATION, (), ())]


def test_a_batch_is_one_operation_per_peer():
    batch = (Op("0", SEND, None, "batch_isend_irecv", peer=1), Op("0", RECV, None, "batch_isend_irecv", peer=2))
    positions = {0: Position(0, "blocked", batch),
                 1: Position(1, "blocked", (Op("0", RECV, None, "recv", peer=0),)),
                 2: Position(2, OUTSIDE)}
    g = _graph(positions, {"0": (0, 1, 2)})
    assert sorted((w.op.kind, w.blocked, w.waits_for) for w in g.waits) == [
        (RECV, (0,), (2,)), (SEND, (0, 1), ())]
    assert sorted(_roots(g)) == [(OPERATION, (), ()), (RANK, (2,), ())]


def test_a_rank_without_a_position_is_waited_for_as_no_data():
    positions = {0: Position(0, "blocked", (coll("0", 2),), {"0": 2})}
    g = explain({1: NO_DATA}, waits_of(positions, {"0": (0, 1)}))
    assert _roots(g) == [(RANK, (), (1,))]


def test_precedes_needs_two_steps_of_history():
    assert precedes([(1, 10)], [(1, 15)], 2, 2) is None
    # tp twice per default op: tp #1 #2, default #1, tp #3 #4, default #2; should tp #6 come before default #3?
    tp = [(1, 10), (2, 11), (3, 20), (4, 21), (5, 30)]
    dflt = [(1, 12), (2, 22)]
    assert precedes(tp, dflt, 6, 3) is True
    assert precedes(tp, dflt, 7, 3) is False


def test_recent_by_group_keeps_the_last_issues_oldest_first():
    issues = [("a", s, 100 - s) for s in range(1, 12)] + [("b", 1, 5)]
    assert recent_by_group(issues, keep=3) == {"a": [(3, 97), (2, 98), (1, 99)], "b": [(1, 5)]}
