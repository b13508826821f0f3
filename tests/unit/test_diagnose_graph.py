"""diagnose on built dumps and logs, arranged by the wait-for graph: roots first, the waits they explain
``blocked_by`` them, ranks without evidence as suspects; and what the dumps alone used to get wrong (issue 21:
all-to-all totals, skewed clocks, a stale dump, output sizes, coalesced members, harmless differences, p2p)."""

from __future__ import annotations

import json

from comm2perfetto.diagnose.diagnosis import diagnose
from comm2perfetto.load_options import LoadOptions
from comm2perfetto.match import load_job
from comm2perfetto.model import Signature
from support.factories import T0_NS, EventLog, FrJob, steady_job

S = 10**9
TIMEOUT = "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 6000ms for recv operation"


def _found(d) -> list[tuple]:
    return [(f.kind, f.seq, f.culprit_ranks, f.suspect_ranks, f.blocked_by) for f in d.findings]


def _logs(world: int, steps: int = 4, op: str = "all_reduce", peer=None) -> list[EventLog]:
    logs = []
    for r in range(world):
        log = EventLog(rank=r, world=world)
        log.group(0, "0", "default_pg", list(range(world)))
        for i in range(steps):
            log.call(op, T0_NS + i * S // 10 + r * 1000, seq=i + 1, shapes=[[4]], dtypes=["Float"], peer=peer)
        logs.append(log)
    return logs


def _write(tmp_path, logs, crashed=(), jobs=()):
    for log in logs:
        log.write(tmp_path, crashed=log.rank in crashed)
    for i, j in enumerate(jobs):
        (tmp_path / f"job.node01.{i}.json").write_text(json.dumps({"format": "comm2perfetto-job", **j}))


# --- the graph on recorded jobs ----------------------------------------------------------------------------


def test_a_broadcast_whose_roots_differ_is_a_root_mismatch(tmp_path):
    logs = _logs(3, op="broadcast", peer=0)
    for log in logs:
        src = 2 if log.rank == 2 else 0
        log.call("broadcast", T0_NS + S, seq=5, shapes=[[4]], dtypes=["Float"], peer=src, error=TIMEOUT)
        log.close(T0_NS + 9 * S)
    _write(tmp_path, logs)
    d = diagnose(load_job([tmp_path]))
    assert (d.status, _found(d)) == ("desync", [("root_mismatch", 5, (2,), (), None)])
    assert "ranks 0, 1: broadcast [[4]] Float root 0; rank 2: broadcast [[4]] Float root 2" in d.findings[0].detail


def _frozen_rank1(tmp_path, probes):
    """Rank 1 stops at 1 s (its last heartbeat); ranks 0 and 2 wait in all_reduce #5, log the stall, and are
    killed with it after a Ctrl-C at 20 s."""
    logs = _logs(3)
    for log in logs:
        if log.rank == 1:
            log.heartbeats(T0_NS + S)
            continue
        log.call("all_reduce", T0_NS + S + S // 2, seq=5, shapes=[[4]], dtypes=["Float"], returns=False)
        log.stall(T0_NS + 4 * S)
        log.heartbeats(T0_NS + 22 * S)
    _write(tmp_path, logs, crashed={0, 1, 2}, jobs=[{
        "host": "node01", "ended_ns": T0_NS + 23 * S, "exit_status": 130, "signal": "SIGINT",
        "signal_ns": T0_NS + 20 * S, "probes": probes}])
    return diagnose(load_job([tmp_path]))


def test_a_rank_seen_stopped_at_the_stall_is_frozen_not_dead(tmp_path):
    d = _frozen_rank1(tmp_path, [{"rank": 1, "pid": 4001, "state": "stopped", "t_ns": T0_NS + 10 * S}])
    assert (d.status, _found(d)) == ("stuck", [("rank_frozen", 5, (1,), (), None)])
    (f,) = d.findings
    assert "stopped making progress" in f.detail and "its process was alive at the stall" in f.detail
    assert "stopped (SIGSTOP, process state T) 9.00 s after its last record" in f.detail
    assert f.ranks_joined == (0, 2)


def test_without_a_sight_of_its_process_the_same_rank_died_first(tmp_path):
    d = _frozen_rank1(tmp_path, [])
    assert (d.status, _found(d)) == ("crashed", [("rank_died", 5, (1,), (), None)])


def test_every_unmatched_send_and_recv_is_told_and_the_waits_lead_to_the_rank_that_sent_nothing(tmp_path):
    job = FrJob(world=3)
    for r in job.ranks:
        job.collective(r, "all_reduce", [[4]])
    job.p2p(0, "send", 1, [[4]], state="started")  # rank 1 receives from 2 instead
    job.p2p(1, "recv", 2, [[4]], state="started")  # rank 2 never sends
    job.write(tmp_path)
    d = diagnose(load_job([tmp_path], LoadOptions(stacks=False)))  # as the command loads: stacks read on demand
    assert _found(d) == [("p2p_mismatch", 1, (2,), (), None), ("p2p_mismatch", 1, (), (), 1)]
    assert "its 1st recv from it, p2p seq 1" in d.findings[0].detail
    assert (d.findings[0].call_sites, d.findings[1].call_sites) == ({1: "pipe.py:20"}, {0: "pipe.py:20"})
    assert d.findings[1].action == "This wait follows from [1]: act on that first."


def test_a_rank_without_data_that_others_wait_for_is_a_suspect(tmp_path):
    job = steady_job(world=3, steps=2)
    for r in (0, 1):
        job.collective(r, "all_reduce", [[4]], state="started")
    job.write(tmp_path, ranks=[0, 1])
    d = diagnose(load_job([tmp_path]))
    assert (d.status, _found(d)) == ("incomplete", [("no_dump", 3, (), (2,), None)])
    assert d.to_json()["suspect_ranks"] == [2] and d.to_json()["culprit_ranks"] == []


# --- what the dumps alone used to get wrong --------------------------------------------------------------


def test_an_all_to_all_whose_totals_disagree_is_a_size_desync(tmp_path):
    job = steady_job(world=4, steps=2)
    for r in job.ranks:
        job.collective(r, "all_to_all", [[8]], [[4]] if r == 3 else [[8]], state="started")
    job.write(tmp_path)
    d = diagnose(load_job([tmp_path]))
    # The totals show a disagreement, not who is wrong: rank 3 differs from the three others, but that vote is
    # no evidence; every rank is a suspect.
    assert (d.status, _found(d)) == ("desync", [("size_mismatch", 3, (), (0, 1, 2, 3), None)])
    assert "together they send 32 elements and receive 28" in d.findings[0].detail


def test_plain_dumps_with_skewed_clocks_are_aligned_on_their_completed_collectives(tmp_path):
    """Rank 2's clock is 5 s ahead: unaligned, it looks 5 s late to the stuck collective. Rank 0 really came
    last, 20 ms after the others."""
    job = steady_job(world=3, steps=8)
    t = T0_NS + S
    for r in job.ranks:
        job.collective(r, "all_reduce", [[4]], state="started", t_ns=t + (20_000_000 if r == 0 else r * 1000))
    for e in job.entries[2]:
        for k in ("time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns"):
            if e[k] is not None:
                e[k] += 5 * S
    job.write(tmp_path)
    loaded = load_job([tmp_path])
    assert loaded.clock.method[2] == "refined" and abs(loaded.clock.offset_ns[2] + 5 * S) < 10**6
    d = diagnose(loaded)
    # 20 ms late against collectives of a few ms: a suspect; arriving late never explains why all still wait.
    assert _found(d) == [("stuck_all_joined", 9, (), (0,), None)]


def test_a_stale_dump_is_a_horizon_not_a_rank_that_never_issued(tmp_path):
    """Rank 2's dump was taken earlier: it shows #5-#7 unfinished, which ranks 0 and 1 completed before they
    got stuck in #8. Whether rank 2 issued #8 is beyond its dump."""
    job = steady_job(world=3, steps=4)
    for r in job.ranks:
        for _ in range(3):
            job.collective(r, "all_reduce", [[4]], state="completed" if r < 2 else "started")
    for r in (0, 1):
        job.collective(r, "all_reduce", [[4]], state="started")
    job.write(tmp_path)
    d = diagnose(load_job([tmp_path]))
    assert (d.status, _found(d)) == ("incomplete", [("no_dump", 8, (), (2,), None)])
    assert "rank 2's dump is older than the others' (from #5 on it shows unfinished" in d.findings[0].detail


def test_a_dump_that_ends_before_collectives_the_others_completed_is_a_horizon(tmp_path):
    """Rank 3's dump stops at #20, every collective in it completed; the others completed #21-#24 (which needs
    every rank) and wait in #25. Rank 3 did issue #21: its dump is older, not a rank that never issued it."""
    job = steady_job(world=4, steps=20)
    for r in (0, 1, 2):
        for _ in range(4):
            job.collective(r, "all_reduce", [[4]])
        job.collective(r, "all_reduce", [[4]], state="started")
    job.write(tmp_path)
    d = diagnose(load_job([tmp_path]))
    assert (d.status, _found(d)) == ("incomplete", [("no_dump", 25, (), (3,), None)])
    assert "rank 3's dump is older than the others' (from #21 on" in d.findings[0].detail


def test_harmless_differences_in_collectives_that_completed_are_a_note(tmp_path):
    job = FrJob(world=2)
    job.collective(0, "all_reduce", [[4, 2]])
    job.collective(1, "all_reduce", [[8]])  # the same 8 elements, another shape
    job.collective(0, "all_gather", [[4]], [[4], [4]])  # two APIs of one all_gather
    job.collective(1, "_allgather_base", [[4]], [[8]])
    job.write(tmp_path)
    d = diagnose(load_job([tmp_path]))
    assert (d.status, d.findings) == ("ok", ())
    assert sum("harmless here" in n for n in d.notes) == 2


def test_the_same_difference_in_a_collective_that_did_not_complete_is_a_desync(tmp_path):
    job = FrJob(world=2)
    job.collective(0, "all_reduce", [[4, 2]], state="started")
    job.collective(1, "all_reduce", [[8]], state="started")
    job.write(tmp_path)
    assert diagnose(load_job([tmp_path])).status == "desync"


def test_signatures_show_output_sizes_roots_and_coalesced_members():
    gather = Signature("all_gather", ((4,),), ("Float",), ((8,),), ("Float",))
    assert gather.describe() == "all_gather [[4]] Float -> [[8]]"
    bcast = Signature("broadcast", ((4,),), ("Float",), ((4,),), ("Float",), root=2)
    assert bcast.describe() == "broadcast [[4]] Float root 2"
    coalesced = Signature("allreduce_coalesced", None, None, None, None, parts=(
        Signature("all_reduce", ((4,),), ("Float",), ((4,),), ("Float",)),
        Signature("all_reduce", ((9,),), ("Float",), ((9,),), ("Float",))))
    assert coalesced.describe() == "allreduce_coalesced of 2 (all_reduce [[4]] Float, all_reduce [[9]] Float)"


def test_a_coalesced_group_names_the_member_that_differs(tmp_path):
    job = FrJob(world=2)
    for r in job.ranks:
        sizes = [[8]] if r == 0 else [[9]]
        job.collective(r, "allreduce_coalesced", [], [], state="started",
                       coalesced=[("all_reduce", [[4]], [[4]]), ("all_reduce", sizes, sizes)])
    job.write(tmp_path)
    (f,) = diagnose(load_job([tmp_path])).findings
    assert (f.kind, f.culprit_ranks, f.suspect_ranks) == ("size_mismatch", (), (0, 1))  # one against one
    assert "The 2nd member differs: all_reduce [[8]] Float against all_reduce [[9]] Float." in f.detail
