"""One classification of every rank's time, drawn by every view: the preview shows what the report measures,
to a pixel, on public GPU traces; CPU ops that only wrap work are never compute; ranks without data, and time
no data covers, are said as such."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from comm2perfetto.intervals import difference, intersection, length, union
from comm2perfetto.report.activity import RankActivity
from comm2perfetto.report.classes import rank_classes
from comm2perfetto.sources.kineto.classify import cpu_class
from comm2perfetto.sources.kineto.profile import kineto_intervals
from comm2perfetto.sources.kineto.reader import read_kineto
from comm2perfetto.trace.check import check_trace
from support.cli import Ran, run_cli_process
from support.png import preview_compute_s

DATA = Path(__file__).resolve().parents[1] / "data" / "kineto"
MI300 = DATA / "tracelens_mi300_resnet_act_checkpoint_rank0.json.gz"
HTA = DATA / "hta_nccl_data.json.gz"
GLOO = DATA / "gloo_ddp_rank0.json.gz"


def _cli(*args: str) -> Ran:
    done = run_cli_process(*args, timeout=300)
    assert done.code == 0, done.err
    return done


@pytest.mark.parametrize("path", [MI300, HTA], ids=["tracelens-mi300", "hta-a100"])
def test_the_previews_compute_is_the_reports_to_a_pixel(path, tmp_path):
    """Each rank's compute-coloured columns, times a column's time, are the report's compute_s to within one
    column (HTA's public trace was 100 % compute in the picture where the report measured 17 %). A trace of one
    rank of a larger job is a sample: the picture draws the ranks traced and says what they cover."""
    trace, png = tmp_path / "job.pftrace", tmp_path / "job.png"
    merged = _cli("merge", str(path), "-o", str(trace), "--preview", str(png))
    doc = json.loads(_cli("report", str(path), "--format", "json").out)
    traced = sorted(map(int, doc["ranks"]))
    assert traced == [0] and doc["world_size"] > 1 and doc["sampled"] == "traces"
    assert f"ranks: 1 of {doc['world_size']} (a sample: traces of rank 0)" in merged.out
    check_trace(trace)
    shown, column_s = preview_compute_s(png, traced)
    report = doc["ranks"]["0"]["compute_s"]
    assert 0 < report < doc["ranks"]["0"]["span_s"] / 2
    assert abs(shown[0] - report) <= column_s, (shown[0], report, column_s)


def test_cpu_ops_that_only_wrap_work_are_never_compute():
    """ProfilerStep#n, Python frames, the backend's own op (gloo:all_reduce), c10d:: and record_param_comms
    wrap work or are communication; runtime calls only launch it. On a real gloo DDP trace (with_stack=True):
    none of them counts as compute, and the compute the report reads is the operators that remain, less the
    communication ops on their thread (DDP's c10d::allreduce_ runs inside autograd's AccumulateGrad)."""
    trace = read_kineto(GLOO)
    classes = {ev.name: cpu_class(ev.kind, ev.name) for ev in trace.cpu_ops}
    wrappers = [name for name, ev_kind in {ev.name: ev.kind for ev in trace.cpu_ops}.items()
                if name.startswith(("ProfilerStep#", "c10d::", "gloo:", "record_param_comms"))
                or ev_kind in ("python_function", "cuda_runtime")]
    assert any(n.startswith("ProfilerStep#") for n in wrappers) and any(n.startswith("c10d::") for n in wrappers)
    assert all(classes[n] != "compute" for n in wrappers)
    assert {n for n, k in classes.items() if k == "comm"} >= {n for n in wrappers if n.startswith("c10d::")}
    compute_ops = [(ev.t_begin_ns, ev.t_end_ns) for ev in trace.cpu_ops if classes[ev.name] == "compute"]
    assert compute_ops and all(ev.kind in ("cpu_op", "user_annotation") for ev in trace.cpu_ops
                               if classes[ev.name] == "compute")
    reported = kineto_intervals([GLOO]).cpu_compute
    by_lane: dict[str, tuple[list, list]] = {}
    for ev in trace.cpu_ops:
        if classes[ev.name] in ("compute", "comm"):
            by_lane.setdefault(ev.lane, ([], []))[classes[ev.name] == "comm"].append((ev.t_begin_ns, ev.t_end_ns))
    assert reported == union([s for ops, comm in by_lane.values() for s in difference(union(ops), union(comm))])
    nested = intersection(union(compute_ops), union([s for _, comm in by_lane.values() for s in comm]))
    assert length(nested) > 0 and length(intersection(nested, reported)) == 0  # the nested collectives left it
    steps = [(ev.t_begin_ns, ev.t_end_ns) for ev in trace.cpu_ops if ev.name.startswith("ProfilerStep#")]
    assert length(intersection(union(steps), reported)) < length(union(steps))  # steps are not all compute


def test_time_outside_the_profiled_windows_is_no_data_not_idle():
    """Where compute is known only inside the profiler's windows, the rest is no data, except communication
    (known everywhere); inside them, what is neither compute nor comm is idle."""
    a = RankActivity(3, "cpu", (), compute=[(10, 20)], comm=[(30, 35), (60, 70)], memory=[], steps=(),
                     compute_windows=((0, 40),))
    c = rank_classes(a, instants=[90])
    assert c.rank == 3 and c.known == [(10, 40), (60, 70)]
    assert c.idle() == [(20, 30), (35, 40)]
    assert c.no_data(0, 100) == [(0, 10), (40, 60), (70, 100)]
    assert c.instants == [90]
    whole = rank_classes(RankActivity(0, "gpu", (), compute=[(0, 5)], comm=[(5, 9)], memory=[(9, 10)], steps=()))
    assert whole.known == [(0, 10)] and whole.idle() == [] and whole.no_data(0, 10) == []
