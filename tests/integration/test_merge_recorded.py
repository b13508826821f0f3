"""``comm2perfetto merge`` on real 2-rank gloo jobs recorded with ``comm2perfetto record``.

Each trace is decoded with the Perfetto protos and checked against the TrackEvent rules (``check_trace``),
then searched for what a person opening it would look for: the stalled all-reduce and the rank it waits
for, the missing rank's stack, the mismatched shapes, DDP's C++-issued collectives on every rank, the
flows that link a collective across ranks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from comm2perfetto.trace.check import check_trace
from comm2perfetto.trace.preview import COLOURS
from support.cli import Ran, run_cli_process
from support.jobs import kill_tree
from support.png import preview_compute_s, preview_rows, preview_window, read_png
from support.torch_features import gloo_flight_recorder

pytestmark = pytest.mark.integration


HANG_JOB = """
import time
import torch
import torch.distributed as dist


def slow_data_loader():
    while True:
        time.sleep(0.1)  # @sleep


dist.init_process_group("gloo")
rank = dist.get_rank()
dist.all_reduce(torch.ones(2))  # @warmup
if rank == 1:
    slow_data_loader()
dist.all_reduce(torch.ones(3))  # @stalled
"""

KILLED_JOB = """
import os, signal
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
for i in range(3):
    dist.all_reduce(torch.ones(4))  # @loop
if rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
dist.all_reduce(torch.ones(4))  # @orphan
"""


def merge(out: Path, target: Path, *extra: str) -> Ran:
    return run_cli_process("merge", str(out), "-o", str(target), *extra, timeout=120)


@pytest.fixture(scope="module")
def hang(module_jobs):
    """Rank 1 never comes back; the scheduler kills the job (SIGKILL) once the stall has been dumped."""
    running = module_jobs.start(HANG_JOB, record_args=["--stall-after", "1"])
    running.wait_until(lambda: _stall_dumped(running.out), "stall dumps of the second all_reduce on both ranks")
    kill_tree(running.proc)
    return running


def _stall_dumped(out: Path) -> bool:
    """Rank 0 reported its second all_reduce as stalled and both ranks have written that stall's dumps. Not just
    any stall: on a loaded machine the warm-up all_reduce can wait past a second too.

    Each stall, whichever rank detects it, makes every rank write one ``k`` record and one dump, so the second
    all_reduce's are the n-th on each rank, n its place among rank 0's stalls. Counted, not timed: rank 1, told
    of the stall through the store, can write its dump before rank 0 has written its own record (seen in CI)."""
    from comm2perfetto.sources.event_log import EventLogError, read_event_log

    try:
        logs = [read_event_log(out / f"rank{rank}.events.jsonl") for rank in (0, 1)]
    except EventLogError:  # not created yet
        return False
    stalled = {c.cid for c in logs[0].calls if c.seq == 2}
    nth = next((n for n, s in enumerate(logs[0].stalls, 1) if s.cid in stalled), None)
    if nth is None:
        return False
    if not gloo_flight_recorder():  # torch 2.4-2.7 write no gloo dump: the stall's stack dumps then
        return all(sum(1 for s in log.stalls if s.stacks_file) >= nth for log in logs)
    return all(sum(1 for _, _, reason in log.fr_dumps if reason == "stall") >= nth for log in logs)


@pytest.fixture(scope="module")
def hang_trace(hang, tmp_path_factory):
    target = tmp_path_factory.mktemp("hang") / "job.pftrace"
    proc = merge(hang.out, target, "--preview", str(target.with_suffix(".png")))
    assert proc.code == 0, proc.err
    return proc, check_trace(target), target


def _line(script: str, marker: str) -> int:
    (n,) = [i for i, text in enumerate(script.splitlines(), 1) if marker in text]
    return n


def test_stalled_all_reduce_is_drawn_to_the_end_and_names_the_rank_it_waits_for(hang, hang_trace):
    _, trace, _ = hang_trace
    (stalled,) = [e for e in trace.events_on("default_pg", process_name="rank 0") if e.args.get("seq") == 2]
    assert stalled.kind == "slice" and stalled.dur is None  # unclosed: runs to the end of the trace
    assert stalled.name == "all_reduce" and stalled.args["state"] == "stalled"
    assert str(stalled.args["waiting_for"]) in ("[1]", "1")
    assert stalled.args["call_site"].startswith(f"job.py:{_line(hang.script, '@stalled')}")
    assert stalled.args["shapes"] == "[[3]]" and stalled.args["bytes"] == 3 * 4


def test_missing_rank_gets_an_instant_with_its_stack(hang, hang_trace):
    _, trace, _ = hang_trace
    (missing,) = [e for e in trace.events_on("default_pg", process_name="rank 1") if e.kind == "instant"]
    assert missing.name == "missing all_reduce (default_pg seq 2)"
    assert "slow_data_loader" in missing.args["stack"]
    assert missing.args["last_collective"] == "all_reduce (default_pg seq 1)"
    # At rank 1's last activity: after its warm-up all-reduce.
    (warmup,) = [e for e in trace.events_on("default_pg", process_name="rank 1") if e.args.get("seq") == 1]
    assert missing.ts >= warmup.ts


def test_completed_collective_is_linked_across_ranks_by_a_flow(hang_trace):
    _, trace, _ = hang_trace
    warmups = {trace.process_of(e).name: e for p in ("rank 0", "rank 1")
               for e in trace.events_on("default_pg", process_name=p) if e.args.get("seq") == 1}
    assert set(warmups) == {"rank 0", "rank 1"}
    assert all(e.dur is not None and e.dur > 0 and e.args["state"] == "completed" for e in warmups.values())
    (fid,) = warmups["rank 0"].flow_ids
    assert warmups["rank 1"].flow_ids == (fid,)
    assert {trace.process_of(e).name for e in trace.flows[fid]} == {"rank 0", "rank 1"}
    assert {e.args["last_arrival_rank"] for e in warmups.values()} == {warmups["rank 0"].args["last_arrival_rank"]}


def test_findings_and_recorder_tracks(hang_trace):
    proc, trace, out = hang_trace
    (finding,) = trace.events_on("findings", process_name="job")
    assert finding.name == "missing_ranks all_reduce (default_pg seq 2)"
    assert finding.args["culprit_ranks"] in ("[1]", "1", [1])
    for rank in (0, 1):
        names = [e.name for e in trace.events_on("recorder", process_name=f"rank {rank}")]
        assert "stall detected" in names
    calls = [e for t in trace.tracks_of("rank 0") if t.name.startswith("python calls")
             for e in trace.events_on(t.name, process_name="rank 0")]
    assert [(e.name, e.args.get("state")) for e in calls] == [("all_reduce", None), ("all_reduce", "stalled")]
    assert "missing_ranks all_reduce (default_pg seq 2)" in proc.out
    assert f"open it: comm2perfetto open {out}" in proc.out


def test_processes_are_ordered_job_then_ranks(hang_trace):
    _, trace, _ = hang_trace
    processes = sorted((t for t in trace.tracks.values() if t.kind == "process"), key=lambda t: t.sort_index)
    assert [p.name for p in processes] == ["job", "rank 0", "rank 1"]


def test_preview_png_is_framed_on_the_stall(hang_trace):
    """The stall and as long a time before it: drawn whole, a stall after a long start-up was a sliver."""
    _, _, target = hang_trace
    _, plot_w, lines = preview_rows(read_png(target.with_suffix(".png")), 2)
    stalled = [sum(c in (COLOURS["stalled"], COLOURS["stripe"]) for c in line) for line in lines]
    assert any(plot_w // 3 < n < plot_w for n in stalled), (stalled, plot_w)  # the stall and what came before


def test_chrome_json_holds_the_same_events(hang, hang_trace, tmp_path):
    _, proto, _ = hang_trace
    target = tmp_path / "job.json.gz"
    proc = merge(hang.out, target)
    assert proc.code == 0, proc.err
    trace = check_trace(target)

    def key(t):
        # Chrome JSON holds times relative to the trace's start, in microseconds with 3 decimals.
        first = min(e.ts for e in t.events)
        return sorted((t.process_of(e).name, e.name, e.kind, e.ts - first, e.dur) for e in t.events
                      if e.kind != "counter")

    assert key(trace) == key(proto)


def test_ranks_and_window_select_what_is_drawn(hang, hang_trace, tmp_path):
    _, full, _ = hang_trace
    target = tmp_path / "rank1.pftrace"
    assert merge(hang.out, target, "--ranks", "1").code == 0
    trace = check_trace(target)
    assert {t.name for t in trace.tracks.values() if t.kind == "process"} == {"job", "rank 1"}
    assert not trace.flows  # a flow needs two ranks drawn
    # A window ending before the stall keeps the warm-up and drops the stalled call.
    (warm,) = [e for e in full.events_on("default_pg", process_name="rank 0") if e.args.get("seq") == 1]
    (stalled,) = [e for e in full.events_on("default_pg", process_name="rank 0") if e.args.get("seq") == 2]
    first = min(e.ts for e in full.events if e.kind != "counter")
    end_us = (warm.ts + warm.dur - first) // 1000 + 1
    if stalled.ts - first > end_us * 1000:
        target = tmp_path / "window.pftrace"
        assert merge(hang.out, target, "--window", f"0:{end_us}us").code == 0
        seqs = {e.args.get("seq") for e in check_trace(target).events_on("default_pg", process_name="rank 0")}
        assert seqs == {1}


@pytest.fixture(scope="module")
def recorded_examples(example_recordings) -> dict[str, Path]:
    """The session's recordings of the DDP example (steps 2-4 profiled) and the shape mismatch."""
    return {name: folder for name, (_status, folder) in example_recordings.items()}


def test_ddp_cpp_collectives_appear_on_every_rank(recorded_examples, tmp_path):
    target = tmp_path / "ddp.pftrace"
    proc = merge(recorded_examples["ddp"], target)
    assert proc.code == 0, proc.err
    trace = check_trace(target)
    # Known from Flight Recorder, or on torch 2.4-2.7 from the dispatcher fallback's records (the event log's,
    # beside the script's own reduce and barrier).
    fr = gloo_flight_recorder()

    def cpp_issued(e) -> bool:
        return e.args.get("source") == "fr" if fr else (e.args.get("source") == "log" and
                                                         e.name not in ("reduce", "barrier"))

    def on_default_pg(rank: int) -> list:
        """The group's slices on its track and on the lanes beside it ("default_pg (2)"), where a collective
        overlapping the previous one goes (DDP's bucket all-reduces, timed from the fallback's records)."""
        lanes = [t.name for t in trace.tracks_of(f"rank {rank}") if t.name.split(" (")[0] == "default_pg"]
        return [e for lane in lanes for e in trace.events_on(lane, process_name=f"rank {rank}")]

    per_rank = {}
    for rank in (0, 1):
        per_rank[rank] = sorted((e.args["seq"], e.name) for e in on_default_pg(rank) if cpp_issued(e))
    assert per_rank[0] == per_rank[1]
    names = {name for _, name in per_rank[0]}
    assert {"all_reduce", "broadcast"} <= names
    # Each C++-issued collective is one flow across both ranks.
    for e in on_default_pg(0):
        if cpp_issued(e):
            (fid,) = e.flow_ids
            assert {trace.process_of(x).name for x in trace.flows[fid]} == {"rank 0", "rank 1"}
    steps = [e.name for e in trace.events_on("steps", process_name="rank 0")]
    assert steps[:2] == ["step 1", "step 2"]
    cpu_tracks = [t.name for t in trace.tracks_of("rank 0") if t.name.startswith("cpu ops")]
    assert cpu_tracks, "the profiler's CPU ops of steps 2-4 are drawn"
    ops = {e.name for t in cpu_tracks for e in trace.events_on(t, process_name="rank 0")}
    assert "c10d::allreduce_" in ops or "c10d::broadcast_" in ops  # DDP's C++ calls, seen by the profiler
    assert "findings: none" in proc.out


def test_the_preview_draws_what_the_report_measures(recorded_examples, tmp_path):
    """On a real DDP job on gloo, steps 2-4 profiled: the picture is framed on the profiled steps (drawn whole,
    the run's start-up and unprofiled steps left them a few columns), each rank's row is measured all along its
    own profiled steps, and each rank's compute in it is the report's to within a column."""
    target, png = tmp_path / "ddp.pftrace", tmp_path / "ddp.png"
    proc = merge(recorded_examples["ddp"], target, "--preview", str(png))
    assert proc.code == 0, proc.err
    done = run_cli_process("report", str(recorded_examples["ddp"]), "--format", "json", timeout=120)
    assert done.code == 0, done.err
    doc = json.loads(done.out)
    shown, column_s = preview_compute_s(png, [0, 1])
    for rank in (0, 1):
        report = doc["ranks"][str(rank)]["compute_s"]
        assert report > 0 and abs(shown[rank] - report) <= column_s, (rank, shown[rank], report, column_s)
    events = [e for e in check_trace(target).events if e.kind != "counter"]
    recorded = max(e.ts + (e.dur or 0) for e in events) - min(e.ts for e in events)
    t0, t1 = preview_window(read_png(png))
    assert t1 - t0 < recorded / 2, (t1 - t0, recorded)
    _, width, lines = preview_rows(read_png(png), 2)
    data_spans = []
    for line in lines:
        measured = [x for x, c in enumerate(line) if c in (COLOURS["compute"], COLOURS["overlap"])]
        assert measured, "a rank's row with no compute in the frame"
        data_spans.append((measured[0], measured[-1]))
        # a rank's own profiled steps are measured all along: "no data" only before and after them (the ranks
        # reach their profiled steps at times that differ by as much as the load makes them)
        inside = line[measured[0]:measured[-1] + 1]
        assert inside.count(COLOURS["nodata"]) <= len(inside) // 50, (inside.count(COLOURS["nodata"]), len(inside))
        assert line.count(COLOURS["comm"]) + line.count(COLOURS["overlap"]) > 0  # DDP's all-reduces
    # the frame is the ranks' profiled steps together, padded by 1 % of it each side
    assert min(b for b, _ in data_spans) <= width * 0.03 and max(e for _, e in data_spans) >= width * 0.97, \
        (data_spans, width)


def test_shape_mismatch_is_marked_on_both_ranks(recorded_examples, tmp_path):
    target = tmp_path / "mismatch.pftrace"
    proc = merge(recorded_examples["mismatch"], target)
    assert proc.code == 0, proc.err
    trace = check_trace(target)
    marks = {}
    for rank in (0, 1):
        (mark,) = [e for e in trace.events_on("default_pg", process_name=f"rank {rank}")
                   if e.name.startswith("size_mismatch")]
        assert mark.name == "size_mismatch all_reduce (default_pg seq 4)"
        marks[rank] = mark.args
    # Nothing in the data shows which side is wrong: both suspects, as diagnose says; gloo aborted rank 0.
    assert marks[0]["signature"] == "all_reduce [[256]] Float"
    assert (marks[0]["culprit"], marks[0]["suspect"], marks[0]["victim"]) == (False, True, True)
    assert marks[1]["signature"] == "all_reduce [[512]] Float"
    assert (marks[1]["culprit"], marks[1]["suspect"], marks[1]["victim"]) == (False, True, False)
    slices = [e for e in trace.events_on("default_pg", process_name="rank 0") if e.args.get("seq") == 4]
    assert slices and slices[0].args["mismatch"] == "size_mismatch"


def test_killed_rank(module_jobs, tmp_path):
    """Rank 1 is SIGKILLed between collectives; torchrun then tears rank 0 down inside the next one."""
    job = module_jobs.run(KILLED_JOB)
    assert job.returncode != 0
    target = tmp_path / "killed.pftrace"
    proc = merge(job.out, target)
    assert proc.code == 0, proc.err
    trace = check_trace(target)
    assert "not closed cleanly" in trace.process_named("rank 1").description
    loops = [e for e in trace.events_on("default_pg", process_name="rank 1") if e.kind == "slice"]
    assert [e.args["seq"] for e in loops] == [1, 2, 3]  # everything rank 1 did before it died
    (missing,) = [e for e in trace.events_on("default_pg", process_name="rank 1") if e.kind == "instant"]
    assert missing.name == "died before all_reduce (default_pg seq 4)"
    assert missing.ts >= max(e.ts + e.dur for e in loops)
    assert "findings (crashed): rank_died all_reduce (default_pg seq 4)" in proc.out
