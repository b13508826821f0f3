"""diagnose over built jobs: every kind of finding, its culprit, call sites and wording."""

from __future__ import annotations

from pathlib import Path

from comm2perfetto.diagnose.diagnosis import diagnose
from comm2perfetto.diagnose.signatures import compare
from comm2perfetto.load_options import LoadOptions
from comm2perfetto.match import load_job
from comm2perfetto.model import Signature
from support.factories import STEP_NS, T0_NS, EventLog, FrJob, stacks_file, steady_job

RECORDINGS = Path(__file__).resolve().parents[1] / "data" / "recording"


def _diagnose(tmp_path, job: FrJob | None = None, **kw):
    if job is not None:
        job.write(tmp_path)
    return diagnose(load_job([tmp_path], LoadOptions(stacks=kw.pop("with_stacks", True))), **kw)


def test_healthy_job_is_ok(tmp_path):
    d = _diagnose(tmp_path, steady_job(world=4, steps=10))
    assert (d.status, d.findings, d.ranks_with_data, d.world_size) == ("ok", (), (0, 1, 2, 3), 4)


def test_missing_rank_names_the_rank_and_what_it_did_instead(tmp_path):
    job = steady_job(world=4, steps=5)
    for r in (0, 1, 3):
        job.collective(r, "all_reduce", [[4]], state="started", site="train.py:90")
    job.write(tmp_path)
    stacks_file(tmp_path, 2, [("/home/user/proj/data.py", 88, "next_batch"), ("train.py", 60, "main")], T0_NS)
    d = _diagnose(tmp_path)
    (f,) = d.findings
    assert (d.status, f.kind, f.seq, f.op) == ("stuck", "missing_ranks", 6, "all_reduce")
    assert (f.ranks_joined, f.ranks_missing, f.culprit_ranks) == ((0, 1, 3), (2,), (2,))
    assert f.call_sites[0] == "train.py:90"
    assert f.stacks == {2: ("data.py:88 next_batch", "train.py:60 main")}
    # Rank 2's last collective is steady_job's 5th: ops rotate with period 4, so op index 4 % 4 = 0.
    assert f.evidence["last_collective"]["2"] == {
        "process_group": "default_pg", "seq": 5, "op": "all_reduce", "state": "completed",
        "call_site": f"train.py:{50 + 4 % 4}"}
    assert "rank 2 never issued all_reduce #6" in f.detail


def test_lazily_loaded_stacks_give_the_same_call_sites(tmp_path):
    job = FrJob(world=2)
    job.collective(0, "all_reduce", [[4]], site="a.py:1")
    job.collective(1, "all_reduce", [[5]], site="b.py:2")
    job.write(tmp_path)
    eager = diagnose(load_job([tmp_path])).findings[0]
    lazy = diagnose(load_job([tmp_path], LoadOptions(stacks=False))).findings[0]
    assert eager.call_sites == lazy.call_sites == {0: "a.py:1", 1: "b.py:2"}


def test_without_history_every_rank_of_a_size_mismatch_is_a_suspect_and_none_a_culprit(tmp_path):
    """One earlier collective is no cycle: nothing shows which side is wrong, and three ranks outvoting one is
    no evidence either (two faulty ranks would outvote a sound one)."""
    job = FrJob(world=4)
    for r in job.ranks:
        job.collective(r, "all_reduce", [[4]])
        job.collective(r, "all_reduce", [[8]] if r != 3 else [[9]], state="started",
                       site="train.py:70" if r != 3 else "train.py:99")
    d = _diagnose(tmp_path, job)
    (f,) = d.findings
    assert (d.status, f.kind, f.seq, f.culprit_ranks, f.suspect_ranks) == ("desync", "size_mismatch", 2, (),
                                                                           (0, 1, 2, 3))
    assert f.call_sites == {0: "train.py:70", 3: "train.py:99"}  # a rank of each side
    assert f.evidence["variants"] == [{"ranks": [0, 1, 2], "signature": "all_reduce [[8]] Float"},
                                      {"ranks": [3], "signature": "all_reduce [[9]] Float"}]


def _looping(job: FrJob, steps: int, ranks=None) -> None:
    """``steps`` steps of two collectives from two call sites, as a training loop issues them."""
    for _ in range(steps):
        for r in ranks if ranks is not None else job.ranks:
            job.collective(r, "all_reduce", [[8]], site="train.py:70")
            job.collective(r, "broadcast", [[2]], site="train.py:71")


def test_a_rank_whose_size_breaks_its_own_cycle_is_the_culprit_even_one_against_one(tmp_path):
    job = FrJob(world=2)
    _looping(job, 4)
    job.collective(0, "all_reduce", [[8]], site="train.py:70", state="started")
    job.collective(1, "all_reduce", [[9]], site="train.py:70", state="started")  # same line, other size
    (f,) = _diagnose(tmp_path, job).findings
    assert (f.kind, f.culprit_ranks, f.suspect_ranks) == ("size_mismatch", (1,), ())
    assert "rank 1: its size at train.py:70 differs from its own cycle" in f.basis
    assert "rank 0 kept its own cycle" in f.basis


def test_two_faulty_ranks_that_agree_do_not_outvote_the_sound_one(tmp_path):
    job = FrJob(world=3)
    _looping(job, 3)
    job.collective(0, "all_reduce", [[8]], site="train.py:70", state="started")
    for r in (1, 2):
        job.collective(r, "all_gather", [[8]], [[24]], site="train.py:99", state="started")
    (f,) = _diagnose(tmp_path, job).findings
    assert (f.kind, f.culprit_ranks) == ("op_mismatch", (1, 2))
    assert "it issued this one from train.py:99, where its own cycle" in f.basis


def test_when_every_side_breaks_its_cycle_nobody_is_the_culprit(tmp_path):
    job = FrJob(world=2)
    _looping(job, 3)
    job.collective(0, "all_reduce", [[5]], site="train.py:80", state="started")
    job.collective(1, "all_reduce", [[6]], site="train.py:81", state="started")
    (f,) = _diagnose(tmp_path, job).findings
    assert (f.kind, f.culprit_ranks, f.suspect_ranks) == ("size_mismatch", (), (0, 1))


def test_two_ranks_that_disagree_with_nothing_to_tell_them_apart_are_both_suspects(tmp_path):
    job = FrJob(world=2)
    job.collective(0, "all_reduce", [[4]], dtype="Float")
    job.collective(1, "all_reduce", [[4]], dtype="BFloat16")
    (f,) = _diagnose(tmp_path, job).findings
    assert (f.kind, f.culprit_ranks, f.suspect_ranks) == ("dtype_mismatch", (), (0, 1))
    assert "Nothing in the data shows which side is wrong" in f.detail


def test_op_mismatch_outranks_size_differences(tmp_path):
    job = FrJob(world=3)
    job.collective(0, "all_reduce", [[4]])
    job.collective(1, "all_reduce", [[5]])
    job.collective(2, "broadcast", [[4]])
    (f,) = _diagnose(tmp_path, job).findings
    # Three clusters of one rank each, no history: no majority, every rank a suspect.
    assert (f.kind, f.culprit_ranks, f.suspect_ranks) == ("op_mismatch", (), (0, 1, 2))


def test_stuck_all_joined_names_the_least_advanced_rank(tmp_path):
    job = FrJob(world=4)
    arrivals = {0: 10, 1: 30, 2: 20, 3: 40}
    for r in job.ranks:
        job.collective(r, "all_reduce", [[4]])
        job.collective(r, "all_reduce", [[4]], t_ns=T0_NS + STEP_NS + arrivals[r], state="started")
    job.set_state(2, 2, "scheduled")  # rank 2's kernel never even started: its GPU is behind
    (f,) = _diagnose(tmp_path, job).findings
    assert (f.kind, f.seq, f.culprit_ranks) == ("stuck_all_joined", 2, (2,))
    assert f.evidence["last_arrival_rank"] == max(arrivals, key=arrivals.get)


def test_stuck_all_joined_without_state_differences_blames_nobody_for_arriving_last(tmp_path):
    """45 ns later than the first, with no clock noise or typical duration known: lateness is no evidence."""
    job = FrJob(world=3)
    for r, t in zip(job.ranks, (5, 50, 7)):
        job.collective(r, "all_reduce", [[4]], t_ns=T0_NS + t, state="started")
    (f,) = _diagnose(tmp_path, job).findings
    assert (f.kind, f.culprit_ranks, f.suspect_ranks) == ("stuck_all_joined", (), ())
    assert "Rank 1 arrived last" in f.detail and "singles nobody out" in f.detail


def test_stuck_all_joined_makes_a_rank_far_later_than_usual_a_suspect_never_a_culprit(tmp_path):
    job = FrJob(world=3)
    for step in range(4):  # completed all_reduces of 1 ms each, every rank on time
        for r in job.ranks:
            job.collective(r, "all_reduce", [[4]], t_ns=T0_NS + step * STEP_NS, duration_ms=1.0)
    for r, late_ms in zip(job.ranks, (0, 40, 0)):
        job.collective(r, "all_reduce", [[4]], t_ns=T0_NS + 4 * STEP_NS + late_ms * 10**6, state="started")
    (f,) = _diagnose(tmp_path, job).findings
    assert (f.kind, f.culprit_ranks, f.suspect_ranks) == ("stuck_all_joined", (), (1,))


def test_a_rank_without_any_data_is_no_dump(tmp_path):
    job = steady_job(world=3, steps=2)  # the dumps' default group lists ranks 0, 1, 2
    job.write(tmp_path, ranks=[0, 1])
    d = _diagnose(tmp_path)
    assert d.status == "incomplete" and [f.kind for f in d.findings] == ["no_dump"]
    # Nothing shows what rank 2 did: a suspect, never a culprit by guess.
    assert (d.findings[0].culprit_ranks, d.findings[0].suspect_ranks, d.world_size) == ((), (2,), 3)


def test_ranks_waiting_for_a_rank_without_data(tmp_path):
    job = FrJob(world=3)
    for r in (0, 1):
        job.collective(r, "all_reduce", [[4]], state="started")
    job.write(tmp_path, ranks=[0, 1])
    (f,) = _diagnose(tmp_path).findings
    assert (f.kind, f.seq, f.ranks_joined, f.culprit_ranks, f.suspect_ranks) == ("no_dump", 1, (0, 1), (), (2,))


def test_unmatched_send_is_a_p2p_mismatch(tmp_path):
    job = FrJob(world=2)
    for r in job.ranks:
        job.collective(r, "all_reduce", [[4]])
    job.p2p(0, "send", 1, [[16]], state="started", site="pipe.py:40")
    (f,) = _diagnose(tmp_path, job).findings
    assert (f.kind, f.culprit_ranks, f.ranks_joined, f.ranks_missing) == ("p2p_mismatch", (1,), (0,), (1,))
    assert f.call_sites == {0: "pipe.py:40"}


def test_p2p_size_mismatch(tmp_path):
    job = FrJob(world=2)
    job.p2p(0, "send", 1, [[16]])
    job.p2p(1, "recv", 0, [[8]])
    (f,) = _diagnose(tmp_path, job).findings
    assert (f.kind, f.culprit_ranks, f.suspect_ranks) == ("p2p_mismatch", (), (0, 1))  # the pair cannot tell which
    assert "the 1st send from rank 0 to rank 1 on default_pg, p2p seq 1" in f.detail.lower()


def test_coalesced_collectives_compare_their_members(tmp_path):
    job = FrJob(world=2, version="2.8")
    for r in job.ranks:
        last = [[4, 4]] if r == 0 else [[5, 5]]
        job.collective(r, "REDUCE_SCATTER_coalesced", [], [], coalesced=[
            ("_reduce_oop", [[4, 4]], [[4, 4]]), ("_reduce_oop", last, last)])
    (f,) = _diagnose(tmp_path, job).findings
    assert (f.kind, f.seq, f.culprit_ranks, f.suspect_ranks) == ("size_mismatch", 1, (), (0, 1))


def test_a_wrapped_ring_buffer_is_not_a_missing_rank(tmp_path):
    job = steady_job(world=2, steps=8)
    job.entries[0] = job.entries[0][3:]  # rank 0 kept only its last 5 records
    assert _diagnose(tmp_path, job).status == "ok"


def test_only_the_first_problem_of_each_group_is_reported(tmp_path):
    job = FrJob(world=2)
    job.group("1", [0, 1], desc="tp")
    for r in job.ranks:
        job.collective(r, "all_reduce", [[4]] if r == 0 else [[5]])
        job.collective(r, "all_reduce", [[6]] if r == 0 else [[7]])
        job.collective(r, "broadcast", [[2]], pg="1", state="started")
    job.entries[1] = [e for e in job.entries[1] if e["process_group"][0] != "1"]
    d = _diagnose(tmp_path, job)
    assert [(f.kind, f.process_group, f.seq) for f in d.findings] == [
        ("size_mismatch", "default_pg", 1), ("missing_ranks", "tp", 1)]
    only_tp = _diagnose(tmp_path, pg="tp")
    assert [f.process_group for f in only_tp.findings] == ["tp"]


def test_a_rank_known_only_from_its_log_disagreeing_with_an_fr_dump(tmp_path):
    # shape_mismatch.py: gloo SIGABRTs one rank (no FR dump from it); its log still holds the call.
    job = FrJob(world=2, backend="gloo")
    for _ in range(3):
        job.collective(0, "all_reduce", [[256]], state="scheduled")
    job.collective(0, "all_reduce", [[256]], state="scheduled")
    job.write(tmp_path, prefix="rank", ranks=[0])
    log = EventLog(rank=1, world=2)
    log.group(0, "0", "default_pg", [0, 1])
    for seq in (1, 2, 3):
        log.call("all_reduce", T0_NS + seq * STEP_NS, seq=seq, shapes=[[256]], dtypes=["Float"])
    log.call("all_reduce", T0_NS + 4 * STEP_NS, seq=4, shapes=[[512]], dtypes=["Float"], returns=False,
             site="shape_mismatch.py:47 main")
    log.write(tmp_path, crashed=True)
    (f,) = _diagnose(tmp_path).findings
    assert (f.kind, f.seq, f.culprit_ranks) == ("size_mismatch", 4, (1,))
    assert f.call_sites[1] == "shape_mismatch.py:47"


def _dump_rank_and_log_rank(folder, closed: bool) -> None:
    """Rank 0: a gloo dump of three all-reduces (DDP's, completion unknown); rank 1: a log that shows only the
    Python-issued #1, closed cleanly or not."""
    job = FrJob(world=2, backend="gloo")
    for _ in range(3):
        job.collective(0, "all_reduce", [[4]], state="scheduled")
    job.write(folder, prefix="rank", ranks=[0])
    log = EventLog(rank=1, world=2)
    log.group(0, "0", "default_pg", [0, 1])
    log.call("all_reduce", T0_NS, seq=1, shapes=[[4]], dtypes=["Float"])
    if closed:
        log.close(T0_NS + 3 * STEP_NS)
    log.write(folder)


def test_recorder_only_ranks_are_not_missing_what_was_issued_from_cpp(tmp_path):
    # DDP's all-reduces come from C++: the recorder never sees them, so a log-only rank has gaps.
    _dump_rank_and_log_rank(tmp_path, closed=True)
    assert _diagnose(tmp_path).status == "ok"


def test_a_rank_inside_a_cpp_collective_waits_for_a_rank_whose_part_is_unseen(tmp_path):
    # Rank 0 issued DDP's all-reduce #3 (gloo: completion unknown) and nothing after it; rank 1's log stops
    # unclosed and shows only the Python-issued #1: whether rank 1 issued #2 and #3 cannot be told, so rank 0
    # may be waiting in #3 for it. Rank 1 is a suspect, nobody a culprit, and the job is not OK.
    _dump_rank_and_log_rank(tmp_path, closed=False)
    d = _diagnose(tmp_path)
    assert d.status != "ok"
    (f,) = d.findings
    assert (f.kind, f.seq, f.ranks_joined, f.suspect_ranks, f.culprit_ranks) == ("no_dump", 3, (0,), (1,), ())
    assert "may still be waiting in it" in f.detail


def test_a_rank_still_inside_a_ddp_broadcast_is_not_the_one_that_skipped_the_next():
    # A real recording (tests/data/recording/README.md): rank 2 froze before DDP's broadcast #6; rank 0 is
    # inside #6, rank 1 inside #7. Rank 0 never issued #7 because it waits in #6: the frozen rank is the cause.
    d = diagnose(load_job([RECORDINGS / "sigstop_ddp"])).to_json()
    assert (d["status"], d["culprit_ranks"], d["suspect_ranks"]) == ("stuck", [2], [])
    (f,) = d["findings"]
    assert (f["kind"], f["seq"], f["ranks_joined"]) == ("rank_frozen", 6, [0])


def test_a_stall_the_job_recovered_from_still_names_the_late_rank(tmp_path):
    hang_ns = 20 * 10**9
    t4 = T0_NS + 4 * STEP_NS
    for r in (0, 1):
        log = EventLog(rank=r, world=2)
        log.group(0, "0", "default_pg", [0, 1])
        for seq in (1, 2, 3):
            log.call("all_reduce", T0_NS + seq * STEP_NS, seq=seq, shapes=[[4]], dtypes=["Float"])
        late = t4 + hang_ns if r == 1 else t4
        log.call("all_reduce", late, seq=4, shapes=[[4]], dtypes=["Float"],
                 dur_ns=(hang_ns + 1000) if r == 0 else 1000, site="hang.py:58 run")
        if r == 0:
            log.stall(t4 + 5 * 10**9, cid=4)
        log.close(t4 + hang_ns + 10**6)
        log.write(tmp_path)
    stacks_file(tmp_path, 1, [("hang.py", 37, "load_next_shard")], t4 + 5 * 10**9)
    d = _diagnose(tmp_path)
    (f,) = d.findings
    # The job went on: no problem left (exit 0), the late rank reported.
    assert (d.status, f.kind, f.seq, f.culprit_ranks, f.resolved) == ("ok", "missing_ranks", 4, (1,), True)
    assert f.stacks == {1: ("hang.py:37 load_next_shard",)}
    assert f"Rank 1 issued all_reduce #4 {hang_ns / 1e9:.1f} s after the first rank" in f.detail


def test_compare_rules():
    def s(op, i, o=None, d=("Float",), src="fr"):
        return Signature(op, i, d, o if o is not None else i, d if src == "fr" else None, src)

    # all_to_all: per-rank sizes may differ (uneven splits).
    assert compare(s("all_to_all_single", ((8,),)), s("all_to_all_single", ((6,),)), 2) is None
    # gather: only the root has outputs.
    assert compare(s("gather", ((4,),), ((4,), (4,))), s("gather", ((4,),), ((),)), 2) is None
    # all_gather: output must be group size x input.
    assert compare(s("all_gather", ((4,),), ((8,),)), s("all_gather", ((4,),), ((12,),)), 2) == "size"
    # gloo runs reduce_scatter_tensor as an all-reduce; the recorder names the Python call.
    assert compare(s("all_reduce", ((4,),)), s("reduce_scatter_tensor", ((4,),), src="log"), 2) is None
    assert compare(s("all_reduce", ((4,),)), s("broadcast", ((4,),), src="log"), 2) == "op"


def test_batched_exchanges_and_pipelines_are_healthy(tmp_path):
    # Patterns torchfrtrace reports as mismatches (it matches batches from the sender's side only).
    job = FrJob(world=3)
    for r in (0, 1):  # an exchange between 0 and 1
        job.p2p(r, "send", 1 - r, [[8]], batch=True)
        job.p2p(r, "recv", 1 - r, [[8]], batch=True)
        job.close_batch(r)
    job.p2p(1, "send", 2, [[4]])  # and a pipeline 1 -> 2 of different length on each rank
    job.p2p(2, "recv", 1, [[4]])
    job.close_batch(2)
    d = _diagnose(tmp_path, job)
    assert d.status == "ok", d.findings


def test_other_backend_prefixes_keep_their_states(tmp_path):
    job = FrJob(world=2, backend="xccl")
    for r in job.ranks:
        job.collective(r, "all_reduce", [[4]], state="started" if r else "completed")
    (f,) = _diagnose(tmp_path, job).findings
    assert (f.kind, f.culprit_ranks) == ("stuck_all_joined", (1,))


def test_a_recv_nobody_sends_seen_by_the_recorder_only(tmp_path):
    # gloo writes no Flight Recorder entry for send/recv: only the recorder sees them.
    for r in (0, 1):
        log = EventLog(rank=r, world=2)
        log.group(0, "0", "default_pg", [0, 1])
        log.call("all_reduce", T0_NS, seq=1, shapes=[[4]], dtypes=["Float"])
        if r == 1:
            log.call("recv", T0_NS + STEP_NS, peer=0, shapes=[[8]], dtypes=["Float"], returns=False,
                     site="pipe.py:12 stage")
        log.write(tmp_path)
    (f,) = _diagnose(tmp_path).findings
    assert (f.kind, f.culprit_ranks, f.call_sites) == ("p2p_mismatch", (0,), {1: "pipe.py:12"})
    assert "rank 0 never sent it" in f.detail


def test_many_missing_ranks_are_named_and_a_few_explained(tmp_path):
    job = FrJob(world=12)
    for r in job.ranks:
        job.collective(r, "all_reduce", [[4]])
    for r in range(6):
        job.collective(r, "all_reduce", [[4]], state="started")
    (f,) = _diagnose(tmp_path, job).findings
    assert f.culprit_ranks == tuple(range(6, 12))
    assert sorted(f.evidence["last_collective"]) == [str(r) for r in range(6, 10)]
    assert "(2 more ranks missing, not detailed.)" in f.detail


def _with_an_extra(steps_after: int) -> FrJob:
    """Two ranks all_reduce at train.py:70 four times; rank 1 then issues one extra all_reduce from
    train.py:99, and both go on for ``steps_after`` more steps (rank 1's shifted by one)."""
    job = FrJob(world=2)
    for _ in range(4):
        for r in job.ranks:
            job.collective(r, "all_reduce", [[4]], site="train.py:70")
    job.collective(1, "all_reduce", [[4]], site="train.py:99")  # the extra one
    for _ in range(steps_after):
        for r in job.ranks:
            job.collective(r, "all_reduce", [[4]], site="train.py:70")
    return job


def test_an_extra_collective_from_its_own_line_is_found_where_the_call_sites_parted(tmp_path):
    """Rank 1 issues one extra all_reduce (train.py:99) in step 5; the signatures still match, so every later
    collective is shifted by one, and the mismatch shows only at the end, where rank 0 reaches the barrier while
    rank 1 is still in the loop. Rank 0 leaving the loop is no deviation: rank 1 left its cycle where the call
    sites parted."""
    job = _with_an_extra(steps_after=3)
    job.collective(0, "barrier", [[1]], site="train.py:80", state="started")
    job.collective(1, "all_reduce", [[4]], site="train.py:70", state="started")
    (f,) = _diagnose(tmp_path, job).findings
    assert (f.kind, f.seq, f.culprit_ranks) == ("op_mismatch", 8, (1,))
    assert "at #5, where the ranks' call sites parted" in f.basis


def test_a_rank_waiting_in_one_collective_too_many_is_the_culprit_not_the_peers_that_finished(tmp_path):
    """As above, but rank 0 simply ends after its 7 all_reduces: rank 1 waits in #8, which rank 0 never issues.
    Rank 0 did everything its program has: rank 1, shifted by its extra all_reduce, is the cause."""
    job = _with_an_extra(steps_after=2)
    job.collective(0, "all_reduce", [[4]], site="train.py:70")  # rank 0's 7th and last
    job.collective(1, "all_reduce", [[4]], site="train.py:70", state="started")  # rank 1's 8th
    d = _diagnose(tmp_path, job)
    (f,) = d.findings
    assert (d.status, f.kind, f.seq, f.culprit_ranks, f.ranks_missing) == ("desync", "sequence_mismatch", 8, (1,),
                                                                           (0,))
    assert f.evidence["parted_at"] == 5


def test_a_send_whose_receiver_issued_nothing_since_is_a_wait_not_a_desync(tmp_path):
    """Rank 1 is away (asleep, deadlocked) when rank 0 sends to it: a hang with rank 1 to blame, status stuck;
    had rank 1 gone on to other collectives, skipping the recv, it would be out of step: desync."""
    job = FrJob(world=2)
    for r in job.ranks:
        job.collective(r, "all_reduce", [[4]])
    job.p2p(0, "send", 1, [[16]], state="started")
    d = _diagnose(tmp_path, job)
    (f,) = d.findings
    assert (d.status, f.kind, f.culprit_ranks, f.evidence["waiting"]) == ("stuck", "p2p_mismatch", (1,), True)
    job.collective(1, "all_reduce", [[4]], state="started", t_ns=T0_NS + 100 * STEP_NS)  # it went on instead
    d = _diagnose(tmp_path, job)
    assert d.status == "desync"


def test_a_receiver_blocked_in_a_collective_the_sender_never_joined_went_on_whatever_the_clocks_say(tmp_path):
    """Rank 1 skipped the recv and went on to an all_reduce rank 0 never joins; its clock puts that call before
    rank 0's send (two hosts' clocks a few ms apart). The two wait on each other: out of step, not away."""
    job = FrJob(world=2)
    for r in job.ranks:
        job.collective(r, "all_reduce", [[4]])
    job.collective(1, "all_reduce", [[4]], state="started", t_ns=T0_NS)  # earlier than any of rank 0's calls
    job.p2p(0, "send", 1, [[16]], state="started")
    d = _diagnose(tmp_path, job)
    f = next(f for f in d.findings if f.kind == "p2p_mismatch")
    assert (d.status, f.culprit_ranks, f.evidence["waiting"]) == ("desync", (1,), False)
