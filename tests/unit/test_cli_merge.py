"""``comm2perfetto merge`` on built dumps: layout, sampling, selection, and every kind of bad input."""

from __future__ import annotations

import os
import pickle
from collections import Counter

import pytest

from comm2perfetto import group_columns
from comm2perfetto.cli.ranges import parse_ranks
from comm2perfetto.group_columns import GroupCollectives
from comm2perfetto.trace.check import check_trace
from comm2perfetto.trace.lanes import UNCLOSED, layout
from support.cli import run_cli
from support.factories import STEP_NS, T0_NS, EventLog, FrJob, steady_job


def _merged_trace(tmp_path, job):
    """Write ``job``'s dumps, merge them with the defaults and return the decoded, rule-checked trace."""
    job.write(tmp_path / "d")
    target = tmp_path / "job.pftrace"
    assert run_cli("merge", str(tmp_path / "d"), "-o", str(target))[0] == 0
    return check_trace(target)


def _stuck_job(tmp_path, world: int = 4, missing: int = 2):
    """Three completed all-reduces, then every rank but ``missing`` waits in a fourth."""
    job = steady_job(world=world, steps=3)
    for r in job.ranks:
        if r != missing:
            job.collective(r, "all_reduce", [[4]], state="started", site="train.py:57")
    job.write(tmp_path)
    return job


# --- lanes -------------------------------------------------------------------------------------------------


def _shape(lanes):
    return [[(k, t) for k, t, _ in lane] for lane in lanes]


def test_lanes_nest_children_and_split_overlaps():
    lanes = layout([(0, 10, "parent"), (2, 5, "child"), (4, 12, "overlap"), (10, 11, "next")])
    assert _shape(lanes) == [[("B", 0), ("B", 2), ("E", 5), ("E", 10), ("B", 10), ("E", 11)],
                             [("B", 4), ("E", 12)]]


def test_lanes_give_an_unclosed_slice_no_child_slices():
    lanes = layout([(0, UNCLOSED, "stalled"), (5, 6, "later"), (7, None, "marker on the stalled one")])
    assert _shape(lanes) == [[("B", 0), ("I", 7)], [("B", 5), ("E", 6)]]


def test_instant_at_a_slice_end_stays_on_its_lane():
    assert _shape(layout([(0, 10, "a"), (10, None, "mark")])) == [[("B", 0), ("E", 10), ("I", 10)]]


# --- the trace of a stuck job --------------------------------------------------------------------------------


def test_stuck_job_marks_stalled_slices_and_the_missing_rank(tmp_path):
    _stuck_job(tmp_path / "dumps")
    target = tmp_path / "job.pftrace"
    code, out, _ = run_cli("merge", str(tmp_path / "dumps"), "-o", str(target))
    assert code == 0
    trace = check_trace(target)
    for rank in (0, 1, 3):
        (last,) = [e for e in trace.events_on("default_pg", process_name=f"rank {rank}") if e.args.get("seq") == 4]
        assert (last.dur, last.args["state"], last.args["waiting_for"]) == (None, "stalled", "[2]")
        assert last.args["call_site"] == "train.py:57 train"
    (missing,) = [e for e in trace.events_on("default_pg", process_name="rank 2") if e.name.startswith("missing")]
    assert missing.name == "missing all_reduce (default_pg seq 4)"
    # Every completed collective is one flow through all four ranks.
    completed = [e for e in trace.events_on("default_pg", process_name="rank 0") if e.args.get("seq") in (1, 2, 3)]
    assert len(completed) == 3
    for e in completed:
        # NCCL without TORCH_NCCL_ENABLE_TIMING: Flight Recorder's end is the watchdog's, so no duration is drawn
        assert e.kind == "instant" and e.args["duration"].startswith("unknown: its GPU work was not timed")
        (fid,) = e.flow_ids
        assert sorted(trace.process_of(x).name for x in trace.flows[fid]) == [f"rank {r}" for r in range(4)]
    assert "4 of 4" in out and "missing_ranks all_reduce (default_pg seq 4)" in out


def test_a_ranks_slices_in_a_window_read_its_own_values_not_every_ranks(tmp_path, monkeypatch):
    """With --window (and for the few odd slices without one) each rank's slice of each collective is made
    one by one: from that rank's columns. Were it read from the collective's view, every rank would decode
    every rank's values of each collective (ranks^2 x collectives: 222 s at 2,048 ranks, now 10 s)."""
    monkeypatch.setattr(group_columns, "SMALL_GROUP_CELLS", 0)  # a big group: views keep nothing
    values = GroupCollectives.values

    def reads_merging(world: int) -> Counter[str]:
        reads: Counter[str] = Counter()

        def counted(self, name, index):
            reads[name] += 1
            return values(self, name, index)

        monkeypatch.setattr(GroupCollectives, "values", counted)
        _stuck_job(tmp_path / f"dumps{world}", world=world, missing=1)
        target = tmp_path / f"job{world}.pftrace"
        assert run_cli("merge", str(tmp_path / f"dumps{world}"), "-o", str(target), "--window", "0:")[0] == 0
        stalled = [e for e in check_trace(target).events_on("default_pg") if e.args.get("state") == "stalled"]
        assert len(stalled) == world - 1  # every slice drawn, the stalled ones too
        return reads

    # a few reads of each collective's values for the job (its span, tracks, flows, shared args), none per rank
    assert reads_merging(4) == reads_merging(12)


def test_collective_args_carry_what_a_person_looks_for(tmp_path):
    job = FrJob(world=2)
    for r in job.ranks:
        job.collective(r, "all_gather", [[256]], [[512]], dtype="BFloat16", t_ns=T0_NS + r * 7_000,
                       duration_ms=0.02)
    trace = _merged_trace(tmp_path, job)
    late = [e for e in trace.events_on("default_pg", process_name="rank 1")]
    (e,) = late
    assert e.name == "all_gather"
    assert {k: e.args[k] for k in ("process_group", "seq", "shapes", "output_shapes", "dtypes", "bytes",
                                   "group_size", "state", "last_arrival_rank", "lateness_ns")} == {
        "process_group": "default_pg", "seq": 1, "shapes": "[[256]]", "output_shapes": "[[512]]",
        "dtypes": "BFloat16", "bytes": 256 * 2, "group_size": 2, "state": "completed", "last_arrival_rank": 1,
        "lateness_ns": 7_000}
    # FR's duration_ms (the GPU's time), drawn from the enqueue: not its discovered completion 50 us after it
    assert (e.ts - T0_NS - 7_000, e.dur) == (0, 20_000)


def test_overlapping_async_collectives_get_a_second_lane(tmp_path):
    job = FrJob(world=2)
    for r in job.ranks:  # the second is issued before the first completes (50 us each, 10 us apart)
        job.collective(r, "all_reduce", [[4]], t_ns=T0_NS, duration_ms=0.05)
        job.collective(r, "all_reduce", [[8]], t_ns=T0_NS + 10_000, duration_ms=0.05)
    trace = _merged_trace(tmp_path, job)
    names = [t.name for t in trace.tracks_of("rank 0")]
    assert "default_pg" in names and "default_pg (2)" in names


def test_collectives_in_flight_counter(tmp_path):
    trace = _merged_trace(tmp_path, steady_job(world=2, steps=3))
    values = [e.value for e in sorted(trace.events_on("collectives in flight", process_name="job"),
                                      key=lambda e: e.ts)]
    assert values == [1, 0] * 3  # 1 ms apart, 50 us long: never two at once


def test_recorder_log_adds_python_calls_and_steps(tmp_path):
    folder = tmp_path / "d"
    for rank in (0, 1):
        log = EventLog(rank=rank, world=2)
        log.group(0, "0", "default_pg", [0, 1])
        log.lines.append(["p", 1, T0_NS, "optimizer"])
        log.call("all_reduce", T0_NS + STEP_NS, seq=1, shapes=[[4]], dtypes=["Float"])
        log.lines.append(["p", 2, T0_NS + 2 * STEP_NS, "optimizer"])
        log.call("barrier", T0_NS + 3 * STEP_NS, seq=2)
        log.close(T0_NS + 4 * STEP_NS)
        log.write(folder)
    target = tmp_path / "job.pftrace"
    assert run_cli("merge", str(folder), "-o", str(target))[0] == 0
    trace = check_trace(target)
    assert [e.name for e in trace.events_on("steps", process_name="rank 1")] == ["step 1", "step 2"]
    (calls,) = [t.name for t in trace.tracks_of("rank 1") if t.name.startswith("python calls")]
    got = [(e.name, e.args["seq"], e.args["call_site"]) for e in trace.events_on(calls, process_name="rank 1")]
    assert got == [("all_reduce", 1, "train.py:57 train"), ("barrier", 2, "train.py:57 train")]
    assert [e.args["source"] for e in trace.events_on("default_pg", process_name="rank 1")] == ["log", "log"]


# --- selection ---------------------------------------------------------------------------------------------


def test_parse_ranks():
    assert parse_ranks("0-3,7, 9") == {0, 1, 2, 3, 7, 9}
    for bad in ("a", "3-1", "-2", ""):
        with pytest.raises(ValueError):
            parse_ranks(bad)


def test_big_job_keeps_implicated_ranks_plus_a_sample(tmp_path):
    world = 300
    _stuck_job(tmp_path / "d", world=world, missing=277)
    target = tmp_path / "job.pftrace"
    code, out, _ = run_cli("merge", str(tmp_path / "d"), "-o", str(target))
    assert code == 0
    trace = check_trace(target)
    shown = {t.name for t in trace.tracks.values() if t.kind == "process"} - {"job"}
    assert "rank 277" in shown and len(shown) == 256
    assert f"showing 256 of {world} ranks" in out
    # Each completed collective: one flow through the shown ranks, from the first to arrive (rank r arrives r us
    # after rank 0) to the last, read from the shown ranks' columns
    last_shown = max(int(name.split()[1]) for name in shown)
    for seq in (1, 2, 3):
        slices = [e for e in trace.events_on("default_pg") if e.args.get("seq") == seq]
        (fid,) = {f for e in slices for f in e.flow_ids}
        assert {trace.process_of(e).name for e in trace.flows[fid]} == shown and len(trace.flows[fid]) == 256
        (end,) = [e for e in trace.flows[fid] if fid in e.terminating_flow_ids]
        assert trace.process_of(end).name == f"rank {last_shown}"
    code, out, _ = run_cli("merge", str(tmp_path / "d"), "-o", str(target), "--all-ranks")
    assert code == 0
    shown = {t.name for t in check_trace(target).tracks.values() if t.kind == "process"} - {"job"}
    assert len(shown) == world


def test_no_align_keeps_raw_clocks(tmp_path):
    folder = tmp_path / "d"
    for rank, offset in ((0, 0), (1, 5_000_000)):
        log = EventLog(rank=rank, world=2, offset_ns=offset)
        log.group(0, "0", "default_pg", [0, 1])
        log.call("all_reduce", T0_NS - offset, seq=1, shapes=[[4]], dtypes=["Float"])
        log.close(T0_NS + STEP_NS)
        log.write(folder)
    aligned, raw = tmp_path / "a.pftrace", tmp_path / "r.pftrace"
    assert run_cli("merge", str(folder), "-o", str(aligned))[0] == 0
    code, out, _ = run_cli("merge", str(folder), "-o", str(raw), "--no-align")
    assert code == 0 and "not aligned" in out

    def start(path, rank):
        (e,) = check_trace(path).events_on("default_pg", process_name=f"rank {rank}")
        return e.ts

    assert start(aligned, 1) == start(aligned, 0) == T0_NS
    assert start(raw, 1) == T0_NS - 5_000_000


# --- bad input -----------------------------------------------------------------------------------------------


def test_unknown_suffix(tmp_path):
    steady_job(world=2, steps=1).write(tmp_path)
    code, _, err = run_cli("merge", str(tmp_path), "-o", str(tmp_path / "job.txt"))
    assert code == 2 and "unknown output format for 'job.txt'" in err and ".pftrace" in err


def test_unwritable_output(tmp_path):
    steady_job(world=2, steps=1).write(tmp_path)
    # /proc takes no new files, even from root (a chmod-ed folder would not stop root).
    code, _, err = run_cli("merge", str(tmp_path), "-o", "/proc/comm2perfetto-test.pftrace")
    assert code == 2 and "cannot write /proc/comm2perfetto-test.pftrace" in err
    code, _, err = run_cli("merge", str(tmp_path), "-o", str(tmp_path / "nccl_trace_rank_0" / "job.pftrace"))
    assert code == 2 and "is not a folder" in err


def test_output_in_a_missing_folder(tmp_path):
    steady_job(world=2, steps=1).write(tmp_path)
    code, _, err = run_cli("merge", str(tmp_path), "-o", str(tmp_path / "nope" / "job.pftrace"))
    assert code == 2 and "does not exist" in err


def test_missing_input_path(tmp_path):
    code, _, err = run_cli("merge", str(tmp_path / "nothing"), "-o", str(tmp_path / "job.pftrace"))
    assert code == 2 and "nothing" in err
    assert not (tmp_path / "job.pftrace").exists()


def test_corrupt_and_malicious_files_are_skipped_and_named(tmp_path):
    steady_job(world=2, steps=2).write(tmp_path)
    (tmp_path / "nccl_trace_rank_1").write_bytes((tmp_path / "nccl_trace_rank_1").read_bytes()[:200])

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch pwned",))

    (tmp_path / "evil.pkl").write_bytes(pickle.dumps(Evil(), protocol=2))
    target = tmp_path / "job.pftrace"
    code, out, _ = run_cli("merge", str(tmp_path), "-o", str(target))
    assert code == 0 and "skipped 2 file(s)" in out
    assert not (tmp_path / "pwned").exists()
    assert {t.name for t in check_trace(target).tracks.values() if t.kind == "process"} >= {"job", "rank 0"}


def test_mixed_jobs_are_refused(tmp_path):
    steady_job(world=2, steps=2).write(tmp_path / "a")
    steady_job(world=4, steps=2).write(tmp_path / "b")
    code, _, err = run_cli("merge", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "j.pftrace"))
    assert code == 2 and "--force" in err


@pytest.mark.parametrize("window", ["10", "b:c", "5:1", "1x:2"])
def test_bad_window(tmp_path, window):
    steady_job(world=2, steps=1).write(tmp_path)
    code, _, err = run_cli("merge", str(tmp_path), "-o", str(tmp_path / "j.pftrace"), "--window", window)
    assert code == 2 and "--window" in err


def test_ranks_not_in_the_job(tmp_path):
    steady_job(world=2, steps=1).write(tmp_path)
    code, _, err = run_cli("merge", str(tmp_path), "-o", str(tmp_path / "j.pftrace"), "--ranks", "5-6")
    assert code == 2 and "none of these ranks" in err


def test_preview_must_be_png(tmp_path):
    steady_job(world=2, steps=1).write(tmp_path)
    code, _, err = run_cli("merge", str(tmp_path), "-o", str(tmp_path / "j.pftrace"), "--preview", "x.jpg")
    assert code == 2 and "PNG" in err


def test_send_and_recv_are_linked_by_a_flow(tmp_path):
    job = FrJob(world=2)
    job.p2p(0, "send", 1, [[4]])
    job.p2p(1, "recv", 0, [[4]])
    trace = _merged_trace(tmp_path, job)
    (send,) = trace.events_on("default_pg", process_name="rank 0")
    (recv,) = trace.events_on("default_pg", process_name="rank 1")
    assert (send.name, send.args["peer"], recv.name, recv.args["peer"]) == ("send", 1, "recv", 0)
    assert send.args["shapes"] == recv.args["shapes"] == "[[4]]" and send.args["bytes"] == 4 * 4
    (fid,) = send.flow_ids
    assert recv.flow_ids == (fid,) and len(trace.flows[fid]) == 2


def test_p2p_and_collective_flows_never_share_an_id(tmp_path):
    """Collectives take flow ids 1..N and transfers the ids after them: a transfer once reused a collective's
    id, which drew one arrow through both."""
    job = FrJob(world=2)
    for r in job.ranks:
        for _ in range(3):
            job.collective(r, "all_reduce", [[4]])
    for _ in range(2):
        job.p2p(0, "send", 1, [[8]])
        job.p2p(1, "recv", 0, [[8]])
    trace = _merged_trace(tmp_path, job)
    linked = {fid: sorted((trace.process_of(e).name, e.name) for e in events) for fid, events in trace.flows.items()}
    assert sorted(linked.values()) == (
        [[("rank 0", "all_reduce"), ("rank 1", "all_reduce")]] * 3 + [[("rank 0", "send"), ("rank 1", "recv")]] * 2
    )
    seqs = {fid: {e.args.get("seq") for e in trace.flows[fid]} for fid in linked if linked[fid][0][1] == "all_reduce"}
    assert sorted(s for v in seqs.values() for s in v) == [1, 2, 3]  # each flow joins one collective's slices


def test_output_defaults_to_the_folder_name(tmp_path):
    steady_job(world=2, steps=1).write(tmp_path / "run1")
    code, out, _ = run_cli("merge", str(tmp_path / "run1") + "/")
    assert code == 0 and f"wrote {tmp_path / 'run1.pftrace'} " in out
    check_trace(tmp_path / "run1.pftrace")


def test_several_inputs_need_a_name(tmp_path):
    steady_job(world=2, steps=1).write(tmp_path / "a")
    dumps = tmp_path / "a"
    code, _, err = run_cli("merge", str(dumps / "nccl_trace_rank_0"), str(dumps / "nccl_trace_rank_1"))
    assert code == 2 and "name the trace with -o" in err and err.count("\n") == 1


def test_output_that_is_a_folder(tmp_path):
    steady_job(world=2, steps=1).write(tmp_path / "run1")
    (tmp_path / "audit1").mkdir()
    code, _, err = run_cli("merge", str(tmp_path / "run1"), "-o", str(tmp_path / "audit1"))
    assert code == 2 and "that is a folder" in err and "audit1/job.pftrace" in err and "unknown" not in err


def test_window_after_the_job_is_refused(tmp_path):
    steady_job(world=2, steps=3).write(tmp_path / "run1")
    target = tmp_path / "j.pftrace"
    code, _, err = run_cli("merge", str(tmp_path / "run1"), "-o", str(target), "--window", "100:200")
    assert code == 2 and "nothing falls in this window" in err and not target.exists()
    code, out, _ = run_cli("merge", str(tmp_path / "run1"), "-o", str(target), "--window", "0:1ns")
    assert code == 0 and "collectives: 3 (1 in the window)" in out


def test_thread_tracks_are_named_by_the_threads_name_where_the_log_has_it(tmp_path):
    folder = tmp_path / "d"
    for rank in (0, 1):
        log = EventLog(rank=rank, world=2)
        log.group(0, "0", "default_pg", [0, 1])
        if rank == 1:
            log.lines.append(["n", 1396872, "MainThread"])
        log.call("all_reduce", T0_NS + STEP_NS, seq=1, shapes=[[4]], dtypes=["Float"])
        log.close(T0_NS + 4 * STEP_NS)
        log.write(folder)
    target = tmp_path / "job.pftrace"
    assert run_cli("merge", str(folder), "-o", str(target))[0] == 0
    trace = check_trace(target)
    names = {p: [t.name for t in trace.tracks_of(p) if t.name.startswith("python calls")] for p in ("rank 0", "rank 1")}
    assert names == {"rank 0": ["python calls (thread 1396872)"], "rank 1": ["python calls (MainThread)"]}
