"""One clock: every time a Job holds is on the job's clock, moved there once by the loader (``match.build_job``),
so that no consumer adds a rank's offset by hand. Checked on a real 4-rank recording (logs, profiler traces,
stall stacks and Flight Recorder dumps) whose ranks' clocks are each some microseconds off rank 0's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson
import pytest

from comm2perfetto.load_options import REPORT, LoadOptions
from comm2perfetto.match import load_job
from comm2perfetto.sources.event_log import _TIME_AT, read_event_log
from comm2perfetto.sources.kineto.profile import RankProfile

RECORDING = Path(__file__).parents[1] / "data" / "recording" / "subgroups"


@pytest.fixture(scope="module")
def jobs():
    """The recording loaded aligned and on each rank's own clock, with every profiler event."""
    return (load_job([RECORDING], LoadOptions(workers=1)),
            load_job([RECORDING], LoadOptions(workers=1, align=False)))


def test_the_recording_has_a_rank_off_rank_0s_clock(jobs):
    aligned, _ = jobs
    assert all(aligned.clock.offset_ns[r] for r in (1, 2, 3))  # so that the tests below mean something
    assert aligned.stall_stacks.keys() == {0, 1} and aligned.traces.keys() == {0, 1, 2, 3}


def test_a_shifted_log_is_the_log_its_rank_would_have_written_on_the_other_clock(tmp_path):
    """``RankLog.shift`` moves every time the reader keeps: the log with each record's time moved by hand reads
    as the original, shifted."""
    offset = 1_234_567
    lines = (RECORDING / "rank1.events.jsonl").read_bytes().splitlines()
    header, *records, closing = map(orjson.loads, lines)
    first_call = next(r for r in records if r[0] == "b")
    t = closing[1] - 1_000_000
    # What this recording lacks: a range, a mark, warnings (one untimed), how the process was ended, an async
    # completion, a heartbeat, a failed call, a live window (its arrivals relative to its begin).
    window = {"steps": 1, "step_ns": None, "exposed_ns": None,
              "groups": {"0": {"issued": 1, "ops": {}, "seqs": [1], "arrivals_us": [20]}}}
    records += [["r", 900, t, "forward", 1, "nvtx"], ["q", 900, t + 10], ["m", t, "epoch", 1, "api"],
                ["w", t, "slow disk"], ["w", None, "untimed"], ["u", t, "signal", "SIGTERM"], ["d", first_call[1], t],
                ["h", t], [*first_call[:1], 9999, t, *first_call[3:]], ["x", 9999, t + 5, "RuntimeError: boom"],
                ["l", 7, t - 50_000, t, window]]
    kinds = set()
    original, moved = [header], [dict(header, wall_ns=header["wall_ns"] + offset)]
    for record in [*records, closing]:
        original.append(list(record))
        at = _TIME_AT.get(record[0])
        if at is not None and isinstance(record[at], int):
            record[at] += offset
            kinds.add(record[0])
        if record[0] == "l":  # its end, too
            record[3] += offset
        moved.append(record)
    assert set(_TIME_AT) <= kinds  # every kind of record that carries a time
    paths = tmp_path / "original.events.jsonl", tmp_path / "moved.events.jsonl"
    for path, content in zip(paths, (original, moved)):
        path.write_bytes(b"\n".join(map(orjson.dumps, content)) + b"\n")

    log = read_event_log(paths[0])
    log.shift(offset)
    expected = read_event_log(paths[1])
    assert not log.problems and log.ranges and any(t is None for t, _ in log.warnings)
    for f in dataclasses.fields(log):
        if f.name not in ("path", "header"):  # the header keeps the rank's own times
            assert getattr(log, f.name) == getattr(expected, f.name), f.name


def test_the_job_holds_logs_traces_and_stall_stacks_on_its_clock(jobs):
    aligned, own = jobs
    for rank in sorted(aligned.ranks):
        offset = aligned.clock.offset_ns.get(rank, 0)
        log, raw = aligned.logs[rank], own.logs[rank]
        assert [c.t_call_ns for c in log.calls] == [c.t_call_ns + offset for c in raw.calls]
        assert [c.t_return_ns for c in log.calls] == [c.t_return_ns + offset for c in raw.calls]
        assert [t for _, t, _ in log.steps] == [t + offset for _, t, _ in raw.steps]
        assert [s.t_ns for s in log.stalls] == [s.t_ns + offset for s in raw.stalls]
        assert (aligned.ranks[rank].first_ns, aligned.ranks[rank].last_ns) == (raw.first_ns + offset,
                                                                                raw.last_ns + offset)
        for trace, raw_trace in zip(aligned.traces[rank], own.traces[rank], strict=True):
            for events, raw_events in ((trace.cpu_ops, raw_trace.cpu_ops), (trace.gpu_events, raw_trace.gpu_events),
                                       (trace.comm_events, raw_trace.comm_events)):
                assert [e.t_begin_ns for e in events] == [e.t_begin_ns + offset for e in raw_events]
            assert [(b, e) for _, b, e in trace.steps] == [(b + offset, e + offset) for _, b, e in raw_trace.steps]
        if rank in aligned.stall_stacks:
            stacks, raw_stacks = aligned.stall_stacks[rank], own.stall_stacks[rank]
            assert stacks.t_ns == raw_stacks.t_ns + offset
            assert [p.since_ns for p in stacks.pending] == [p.since_ns + offset for p in raw_stacks.pending]
            assert stacks.threads == raw_stacks.threads


def test_the_profiles_report_measures_are_on_the_jobs_clock():
    aligned = load_job([RECORDING], dataclasses.replace(REPORT, workers=1))
    own = load_job([RECORDING], dataclasses.replace(REPORT, workers=1, align=False))
    offset = aligned.clock.offset_ns[1]
    profile, raw = aligned.profiles[1], own.profiles[1]
    assert profile.cpu_compute and profile.cpu_comm and profile.windows
    assert profile.cpu_compute == [(b + offset, e + offset) for b, e in raw.cpu_compute]
    assert profile.cpu_comm == [(b + offset, e + offset) for b, e in raw.cpu_comm]
    assert profile.windows == tuple((b + offset, e + offset) for b, e in raw.windows)
    assert profile.traces == () and aligned.traces[1]  # its communication events live in the job, moved once


def test_a_shifted_profile_moves_every_span_and_step():
    spans = [(10, 20), (30, 40)]
    steps = ((1, 10, 20), (2, 20, 40))
    profile = RankProfile(gpu_compute=spans, gpu_comm=spans, gpu_memory=spans, cpu_compute=spans, cpu_comm=spans,
                          gpu_overlapped=spans, gpu_busy=spans, steps=steps, gpu_steps=steps,
                          windows=tuple(spans), traces=("adopted by the job",), events=9, notes=("a note",))
    moved = profile.shifted(5)
    for f in dataclasses.fields(RankProfile):
        before, after = getattr(profile, f.name), getattr(moved, f.name)
        if f.name == "traces":
            assert after == ()
        elif isinstance(before, (list, tuple)) and before and isinstance(before[0], tuple):
            assert list(after) == [(*x[:-2], x[-2] + 5, x[-1] + 5) for x in before], f.name
        else:
            assert after == before, f.name
    assert RankProfile(gpu_overlapped=None).shifted(5).gpu_overlapped is None


def test_loading_twice_gives_the_same_times(jobs):
    """The readers' objects are moved in place once per load: a second load starts again from the files."""
    again = load_job([RECORDING], LoadOptions(workers=1))
    assert [c.t_call_ns for c in again.logs[1].calls] == [c.t_call_ns for c in jobs[0].logs[1].calls]


def test_a_shifted_profiler_trace_moves_every_event_and_step():
    def read():
        (trace,) = load_job([RECORDING], LoadOptions(workers=1, align=False)).traces[1]
        trace.steps, trace.gpu_steps = ((1, 10, 20),), ((1, 15, 25),)
        return trace

    before, trace = read(), read()
    trace.shift(5)
    for f in dataclasses.fields(trace):
        old, new = getattr(before, f.name), getattr(trace, f.name)
        if f.name in ("comm_events", "cpu_ops", "gpu_events", "gpu_annotations"):
            assert [dataclasses.replace(e, t_begin_ns=e.t_begin_ns + 5) for e in old] == list(new), f.name
        elif f.name in ("steps", "gpu_steps"):
            assert new == tuple((n, b + 5, e + 5) for n, b, e in old), f.name
        else:
            assert new == (old + 5 if f.name == "base_time_ns" else old), f.name
    assert trace.comm_events and trace.cpu_ops
