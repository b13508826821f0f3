"""The sizes of calls gloo checks only by aborting a rank (an all-to-all's splits, an object collective's list
length): read from the `b` record's ``sizes`` field and checked (sources/event_log.py), carried into the
signatures of the matched collectives, where the recorder's op and sizes win over Flight Recorder's names
(tracks.joined_signature)."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from comm2perfetto.diagnose.diagnosis import diagnose
from comm2perfetto.diagnose.signatures import compare
from comm2perfetto.match import load_job
from comm2perfetto.model import Exchange, Signature
from comm2perfetto.sources.event_log import read_event_log
from comm2perfetto.tracks import joined_signature
from support.factories import STEP_NS, T0_NS, EventLog, FrJob

DOCS = Path(__file__).resolve().parents[2] / "docs" / "log-format.md"
HEADER = {"kind": "header", "format": "comm2perfetto-events", "version": 1, "rank": 1, "world_size": 3}
GROUP = ["g", 0, "0", "default_pg", [0, 1, 2], "gloo"]
# The argument signatures (`a` records) the calls below use.
ARGS = [["a", 1, [[6]], ["Float"], 24], ["a", 2, [[7, 2]], ["Float"], 56],
        ["a", 3, [[2], [2], [2]], ["Float"] * 3, 24], ["a", 4, [], [], None]]


def _log(tmp_path: Path, calls: list[tuple[str, list, object]], functional: int = 0) -> Path:
    """A rank's log holding one call per (op, input shapes, sizes); sizes None: a log without the field."""
    lines: list = [HEADER, GROUP, *ARGS, ["s", 1, "job.py:9 <module>"]]
    aids = {str(a[2]): a[1] for a in ARGS}
    for cid, (op, shapes, sizes) in enumerate(calls, 1):
        record = ["b", cid, T0_NS + cid, op, 0, cid, None, False, 7, 1, 0, 0, aids[str(shapes)]]
        if sizes is not None:
            record += [functional, 0, sizes]
        lines += [record, ["e", cid, T0_NS + cid + 1, cid]]
    lines.append(["z", T0_NS + 100, 1, "exit"])
    path = tmp_path / "rank1.events.jsonl"
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return path


def test_split_sizes_become_elements_to_and_from_each_peer(tmp_path):
    log = read_event_log(_log(tmp_path, [
        ("all_to_all_single", [[6]], [[1, 2, 3], [3, 2, 1], [6]]),
        ("all_to_all_single", [[7, 2]], [[4, 0, 3], None, [6, 2]]),  # rows of 2 elements; output split evenly
        ("all_to_all_single", [[7, 2]], [None, [1, 1, 1], [3, 2]]),  # 7 rows do not split evenly 3 ways
        ("all_to_all", [[2], [2], [2]], [[[2], [3], [1, 1]]]),
    ]))
    assert log.problems == []
    assert [c.exchange for c in log.calls] == [
        Exchange(send=(1, 2, 3), recv=(3, 2, 1)),
        Exchange(send=(8, 0, 6), recv=(4, 4, 4), send_given=True, recv_given=False),
        Exchange(send=None, recv=(2, 2, 2), send_given=False, recv_given=True),
        Exchange(send=(2, 2, 2), recv=(2, 3, 1)),
    ]
    assert [c.objects for c in log.calls] == [None] * 4


def test_a_functional_all_to_all_makes_its_output_from_the_splits(tmp_path):
    log = read_event_log(_log(tmp_path, [("all_to_all_single", [[6]], [[1, 2, 3], [2, 2, 4]]),
                                         ("all_to_all_single", [[6]], [[1, 2, 3], None])], functional=1))
    assert log.problems == [] and all(c.functional for c in log.calls)
    assert [c.exchange for c in log.calls] == [Exchange(send=(1, 2, 3), recv=(2, 2, 4)),  # output: 8 rows
                                               Exchange(send=(1, 2, 3), recv=(2, 2, 2), recv_given=False)]


@pytest.mark.parametrize("op", ["broadcast_object_list", "all_gather_object", "gather_object",
                                "scatter_object_list", "send_object_list", "recv_object_list"])
def test_object_collectives_carry_their_list_length(tmp_path, op):
    log = read_event_log(_log(tmp_path, [(op, [], [3]), (op, [], [None]), (op, [], [0])]))
    assert log.problems == []
    assert [(c.op, c.objects, c.exchange) for c in log.calls] == [(op, 3, None), (op, None, None), (op, 0, None)]


def test_a_log_without_sizes_reads_as_before(tmp_path):
    """Logs of earlier versions have no sizes field: nothing is made up for them."""
    log = read_event_log(_log(tmp_path, [("all_to_all_single", [[6]], None), ("broadcast_object_list", [], None),
                                         ("all_to_all", [[2], [2], [2]], None)]))
    assert log.problems == []
    assert [(c.op, c.exchange, c.objects) for c in log.calls] == [
        ("all_to_all_single", None, None), ("broadcast_object_list", None, None), ("all_to_all", None, None)]


def test_a_sizes_field_of_an_op_this_reader_does_not_know_is_ignored(tmp_path):
    """A newer writer may log sizes of more ops: they are no error, and mean nothing here yet."""
    log = read_event_log(_log(tmp_path, [("all_reduce", [[6]], [[1, 2, 3]])]))
    assert log.problems == [] and (log.calls[0].exchange, log.calls[0].objects) == (None, None)


@pytest.mark.parametrize(("op", "shapes", "sizes", "why"), [
    ("all_to_all_single", [[6]], [[3, 3], None, [6]], "split sizes [3, 3] are not one per member of its 3-rank "
                                                      "group"),
    ("all_to_all_single", [[6]], [[-1, 4, 3], None, [6]], "split sizes [-1, 4, 3] are not one per member"),
    ("all_to_all_single", [[6]], [[True, 2, 3], None, [6]], "split sizes [True, 2, 3] are not one per member"),
    ("all_to_all_single", [[6]], [[2.0, 2, 2], None, [6]], "split sizes [2.0, 2, 2] are not one per member"),
    ("all_to_all_single", [[6]], [[2**63, 0, 0], None, [6]], "are not one per member"),
    ("all_to_all_single", [[6]], ["2,2,2", None, [6]], "split sizes '2,2,2' are not one per member"),
    ("all_to_all_single", [[6]], [None, None, "6"], "output shape '6' is not a shape"),
    ("all_to_all_single", [[6]], [None, None, []], "output shape [] is not a shape"),
    ("all_to_all_single", [[6]], [None, None, [6], 1], "sizes [None, None, [6], 1] of an all_to_all_single"),
    ("all_to_all_single", [[6]], {"in": [2, 2, 2]}, "sizes {'in': [2, 2, 2]} are not a list"),
    ("all_to_all_single", [], [None, None, [6]], "of an all_to_all_single of input []"),
    ("all_to_all", [[2], [2], [2]], [[[2], [2]]], "all_to_all's tensors [[2], [2], [2]] -> [[2], [2]] are not one "
                                                  "per member of its 3-rank group"),
    ("all_to_all", [[2], [2], [2]], [[[2], [-2], [2]]], "are not one per member"),
    ("broadcast_object_list", [], [-1], "object list length [-1] is not one count"),
    ("broadcast_object_list", [], ["3"], "object list length ['3'] is not one count"),
    ("broadcast_object_list", [], [3, 4], "object list length [3, 4] is not one count"),
    ("broadcast_object_list", [], 3, "sizes 3 are not a list"),
])
def test_bad_sizes_are_dropped_and_counted_and_the_call_kept(tmp_path, op, shapes, sizes, why):
    log = read_event_log(_log(tmp_path, [(op, shapes, sizes), (op, shapes, sizes), ("all_reduce", [[6]], None)]))
    assert [(c.op, c.exchange, c.objects) for c in log.calls] == [(op, None, None)] * 2 + [("all_reduce", None, None)]
    (problem,) = log.problems
    assert problem.startswith(f"rank1.events.jsonl: the sizes of 2 calls skipped, the calls kept (call 1, {op}: ")
    assert why in problem


def test_the_documented_example_reads_as_documented(tmp_path):
    """docs/log-format.md's raw example of the sizes field, through the reader."""
    section = DOCS.read_text().split("### Sizes of all-to-all and object collectives")[1]
    example = re.search(r"```text\n(.*?)```", section, re.S)  # a file's contents are fenced as text
    assert example is not None
    header = {**HEADER, "rank": 0, "world_size": 2, "wall_ns": 1795900295000000000}
    lines = [orjson.dumps(header), b'["g",0,"0","default_pg",[0,1],"gloo"]', b'["s",4,"job.py:13 <module>"]',
             *example.group(1).encode().splitlines()]
    path = tmp_path / "rank0.events.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    log = read_event_log(path)
    assert log.problems == [log.problems[0]] and "not closed cleanly" in log.problems[0]  # the example ends there
    assert [(c.op, c.exchange, c.objects) for c in log.calls] == [
        ("all_to_all_single", Exchange(send=(3, 2), recv=(3, 2)), None),
        ("all_to_all_single", Exchange(send=(3, 3), recv=(3, 3), send_given=False, recv_given=False), None),
        ("broadcast_object_list", None, 3)]


# --- the join: the recorder's op and sizes, Flight Recorder's name kept --------------------------------------


def _gloo_job(tmp_path: Path, fr_ops: list[tuple[str, list, list]], calls: dict[int, list[dict]],
              fr_ranks: tuple[int, ...] = (0, 1)) -> None:
    """Two ranks: Flight Recorder entries (gloo's names) on ``fr_ranks``, and each rank's recorder calls."""
    job = FrJob(world=2, backend="gloo")
    for r in fr_ranks:
        for op, ins, outs in fr_ops:
            job.collective(r, op, ins, outs, dtype="Long" if op == "broadcast" else "Float")
    job.write(tmp_path, prefix="rank", ranks=list(fr_ranks))
    for r, rank_calls in calls.items():
        log = EventLog(rank=r, world=2)
        log.group(0, "0", "default_pg", [0, 1])
        for i, call in enumerate(rank_calls):
            log.call(t_ns=T0_NS + i * STEP_NS + r * 1000, **call)
        log.close(T0_NS + 10 * STEP_NS)
        log.write(tmp_path)


RST = {"op": "reduce_scatter_tensor", "seq": 1, "shapes": [[4]], "dtypes": ["Float"]}


def test_the_user_op_wins_and_flight_recorders_name_is_kept(tmp_path):
    a2a = {"op": "all_to_all_single", "seq": 3, "shapes": [[5]], "dtypes": ["Float"]}
    calls = {r: [RST, {"op": "all_gather_into_tensor", "seq": 2, "shapes": [[2]], "dtypes": ["Float"]},
                 {**a2a, "sizes": [[3, 2], [2, 3], [5]] if r == 0 else [[2, 3], [3, 2], [5]]},
                 {"op": "broadcast_object_list", "seq": 4, "seq_last": 5, "peer": 0, "shapes": [], "dtypes": [],
                  "sizes": [3]}] for r in (0, 1)}
    _gloo_job(tmp_path, [("all_reduce", [[4]], [[4]]), ("all_gather", [[2]], [[2, 2]]),
                         ("all_to_all", [[5]], [[5]]), ("broadcast", [[3]], [[3]]), ("broadcast", [[48]], [[48]])],
              calls)
    job = load_job([tmp_path])
    cols = job.collectives["0[0,1]"]
    assert [c.op for c in cols] == ["reduce_scatter_tensor", "all_gather_into_tensor", "all_to_all_single",
                                    "broadcast_object_list", "broadcast_object_list"]
    rst, agit, a2a_c, bol, payload = (c.signatures[0] for c in cols)
    # gloo's all_reduce of the whole input is not the user's reduce-scatter: its outputs are left out
    assert (rst.fr_op, rst.input_sizes, rst.output_sizes, rst.source) == ("all_reduce", ((4,),), None, "fr")
    assert (agit.fr_op, agit.input_sizes, agit.output_sizes) == ("all_gather", ((2,),), ((2, 2),))  # same op
    assert a2a_c.exchange == Exchange(send=(3, 2), recv=(2, 3)) and a2a_c.fr_op == "all_to_all"
    assert cols[2].signatures[1].exchange == Exchange(send=(2, 3), recv=(3, 2))
    # an object collective keeps the sizes of the tensors torch made of the objects
    assert (bol.fr_op, bol.input_sizes, bol.input_dtypes, bol.objects, bol.root) == (
        "broadcast", ((3,),), ("Long",), 3, 0)
    assert (payload.op, payload.input_sizes, payload.objects) == ("broadcast_object_list", ((48,),), None)
    assert diagnose(job).status == "ok"


def test_a_rank_with_flight_recorder_alone_compares_by_its_names(tmp_path):
    """Rank 1's log is gone: its entry says all_reduce where rank 0's joined one says reduce_scatter_tensor,
    which is the same collective on gloo."""
    _gloo_job(tmp_path, [("all_reduce", [[4]], [[4]])], {0: [RST]})
    job = load_job([tmp_path])
    (c,) = job.collectives["0[0,1]"]
    assert c.sources == ("fr+log", "fr") and c.op == "reduce_scatter_tensor"
    assert diagnose(job).status == "ok"


def test_different_user_ops_that_gloo_runs_alike_are_an_op_mismatch(tmp_path):
    """Gloo runs reduce_scatter_tensor as an all_reduce: Flight Recorder alone sees nothing wrong."""
    _gloo_job(tmp_path, [("all_reduce", [[4]], [[4]])],
              {0: [RST], 1: [{**RST, "op": "all_reduce"}]})
    (f,) = diagnose(load_job([tmp_path])).findings
    assert (f.kind, f.seq, f.op) == ("op_mismatch", 1, "reduce_scatter_tensor")


def test_joined_signatures_compare_as_the_user_called_them():
    fr = Signature("all_reduce", ((4,),), ("Float",), ((4,),), ("Float",))
    rst = joined_signature(fr, Signature("reduce_scatter_tensor", ((4,),), ("Float",), None, None, "log"))
    other = joined_signature(fr, Signature("all_reduce", ((4,),), ("Float",), None, None, "log"))
    assert (rst.op, rst.fr_op, other.op, other.fr_op) == ("reduce_scatter_tensor", "all_reduce", "all_reduce",
                                                          "all_reduce")
    assert compare(rst, other, 2) == "op" and compare(other, rst, 2) == "op"
    assert compare(rst, fr, 2) is None and compare(fr, rst, 2) is None  # FR's names agree
    assert compare(rst, Signature("broadcast", ((4,),), ("Float",), ((4,),), ("Float",)), 2) == "op"
    bigger = joined_signature(Signature("all_reduce", ((6,),), ("Float",), ((6,),), ("Float",)),
                              Signature("reduce_scatter_tensor", ((6,),), ("Float",), None, None, "log"))
    assert compare(rst, bigger, 2) == "size"


def _dispatch(tmp_path: Path, splits: dict[int, list[int]], steps: int = 4, dies: int | None = None):
    """Three ranks all_to_all_single 9 elements, 3 to each, ``steps`` times; then each sends ``splits[rank]``
    (expecting 3 from each). ``dies``: the rank whose log stops inside that call (gloo's SIGABRT)."""
    for r in range(3):
        log = EventLog(rank=r, world=3)
        log.group(0, "0", "default_pg", [0, 1, 2])
        for i in range(steps):
            log.call("all_to_all_single", T0_NS + i * STEP_NS, seq=i + 1, shapes=[[9]], dtypes=["Float"],
                     sizes=[[3, 3, 3], [3, 3, 3], [9]], site="moe.py:40 dispatch")
        t = T0_NS + steps * STEP_NS
        log.call("all_to_all_single", t, seq=steps + 1, shapes=[[9]], dtypes=["Float"], returns=r != dies,
                 sizes=[splits[r], [3, 3, 3], [9]], site="moe.py:40 dispatch")
        if r != dies:
            log.close(t + STEP_NS)
        log.write(tmp_path, crashed=r == dies)
    job_file = {"format": "comm2perfetto-job", "host": "node01", "ended_ns": T0_NS + (steps + 2) * STEP_NS,
                "exit_status": 1}
    (tmp_path / "job.node01.1.json").write_bytes(orjson.dumps(job_file))  # the job on its host ended
    return diagnose(load_job([tmp_path]))


def test_an_all_to_all_whose_pairs_disagree_names_the_rank_that_broke_its_splits_and_its_victim(tmp_path):
    """Rank 0 sends 2 to rank 1 and 4 to rank 2 where both expect 3 (its totals agree): gloo aborts rank 2,
    which received more than it expected. Rank 0's splits break its own cycle; ranks 1 and 2 keep theirs."""
    d = _dispatch(tmp_path, {0: [3, 2, 4], 1: [3, 3, 3], 2: [3, 3, 3]}, dies=2)
    (f,) = d.findings
    assert (d.status, f.kind, f.culprit_ranks, f.suspect_ranks, f.victim_ranks) == (
        "desync", "size_mismatch", (0,), (), (2,))
    assert ("rank 0 sends 2 elements to rank 1, which expects 3 from it; rank 0 sends 4 elements to rank 2, which "
            "expects 3 from it") in f.detail
    assert f.evidence["pairs"] == [{"src": 0, "dst": 1, "sends": 2, "expects": 3},
                                   {"src": 0, "dst": 2, "sends": 4, "expects": 3}]
    assert f.evidence["splits_differ"] == 0
    assert "Rank 0 is in every pair that disagrees: its split sizes differ from its peers'." in f.detail


def test_an_all_to_all_whose_pairs_disagree_without_history_names_suspects_only(tmp_path):
    d = _dispatch(tmp_path, {0: [3, 2, 4], 1: [3, 3, 3], 2: [3, 3, 3]}, steps=0, dies=2)
    (f,) = d.findings
    assert (f.kind, f.culprit_ranks, f.suspect_ranks, f.victim_ranks) == ("size_mismatch", (), (0, 1, 2), (2,))
    assert "Nothing in the data shows which side is wrong" in f.detail


def test_two_ranks_whose_splits_differ_leave_no_one_rank_in_every_pair(tmp_path):
    """Ranks 0 and 1 both send uneven splits: four pairs disagree, no rank is in all of them, none is named."""
    d = _dispatch(tmp_path, {0: [3, 2, 4], 1: [4, 3, 2], 2: [3, 3, 3]}, steps=0, dies=2)
    (f,) = d.findings
    assert [(p["src"], p["dst"]) for p in f.evidence["pairs"]] == [(0, 1), (0, 2), (1, 0), (1, 2)]
    assert "splits_differ" not in f.evidence and "in every pair" not in f.detail


def test_flight_recorders_all_to_all_lists_name_the_pair_that_disagrees(tmp_path):
    """NCCL's Flight Recorder alone: all_to_all's one tensor per peer says what each rank sends and expects, so the
    pair is named, not only the totals (15 elements sent, 14 received)."""
    job = FrJob(world=2, backend="nccl")
    for r in range(2):
        job.collective(r, "all_to_all", [[2 + r], [5]], [[2], [3]] if r == 0 else [[4], [5]])
    job.write(tmp_path, prefix="rank", ranks=[0, 1])
    (f,) = diagnose(load_job([tmp_path])).findings
    assert (f.kind, f.seq, f.culprit_ranks, f.suspect_ranks) == ("size_mismatch", 1, (), (0, 1))
    assert f.evidence["pairs"] == [{"src": 0, "dst": 1, "sends": 5, "expects": 4}]
    assert "rank 0 sends 5 elements to rank 1, which expects 4 from it" in f.detail
