"""A collective's time on a GPU is its communication kernels, on public profiler traces: every figure is checked
against one computed here from the raw JSON, the independent way: ``record_param_comms`` (the CPU enqueue) ->
the runtime launches inside its span on its thread (``hipExtLaunchKernel``/``cudaLaunchKernel``,
``args.correlation``) -> the kernels of the same correlation."""

from __future__ import annotations

import gzip
import json
import pickle
from collections import defaultdict
from pathlib import Path

import pytest

from comm2perfetto.match import load_job
from comm2perfetto.model import DTYPE_BYTES
from comm2perfetto.report.bandwidth import CollectiveTable
from comm2perfetto.report.document import build_report
from comm2perfetto.sources.kineto.profile import read_profiles
from comm2perfetto.trace.check import check_trace
from support.cli import run_cli_process

DATA = Path(__file__).resolve().parents[1] / "data" / "kineto"
MI300 = DATA / "tracelens_mi300_resnet_act_checkpoint_rank0.json.gz"
HTA = DATA / "hta_nccl_data.json.gz"
# record_param_comms' names -> the report's ops
OPS = {"allreduce": "all_reduce", "broadcast": "broadcast"}


def _raw_collectives(path: Path) -> dict[str, list[dict]]:
    """Per op, each collective's bytes (S as nccl-tests counts it for all_reduce and broadcast: the buffer),
    its kernels' first begin and last end, and its enqueue (the CPU op's begin), in us as the file has them."""
    events = json.loads(gzip.open(path).read())["traceEvents"]
    launches = defaultdict(list)  # tid -> (ts, correlation)
    kernels = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {}):
            launches[e["tid"]].append((e["ts"], e["args"]["correlation"]))
        elif e.get("cat") == "kernel" and "nccl" in e["name"].lower():
            kernels[e["args"]["correlation"]] = e
    out = defaultdict(list)
    for e in events:
        args = e.get("args", {})
        op = OPS.get(args.get("Collective name"))
        if e.get("name") != "record_param_comms" or op is None:
            continue
        mine = [kernels[c] for t, c in launches[e["tid"]] if e["ts"] <= t <= e["ts"] + e["dur"] and c in kernels]
        assert mine, f"no kernel for {op} at {e['ts']}"
        out[op].append({"bytes": args["In msg nelems"] * DTYPE_BYTES[args["dtype"]],
                        "begin": min(k["ts"] for k in mine), "end": max(k["ts"] + k["dur"] for k in mine),
                        "enqueue": e["ts"], "group_size": args["Group size"]})
    return out


def _report(path: Path, tmp_path: Path) -> dict:
    folder = tmp_path / path.stem
    folder.mkdir()
    (folder / path.name).symlink_to(path)
    job = load_job([folder])
    profiles = read_profiles({0: [folder / path.name]})
    return build_report(job, profiles)


@pytest.mark.parametrize("path", [MI300, HTA], ids=["tracelens-mi300", "hta-a100"])
def test_times_and_bandwidth_are_the_kernels(path, tmp_path):
    raw = _raw_collectives(path)
    doc = _report(path, tmp_path)
    rows = {r["op"]: r for r in doc["collectives"]}
    assert set(rows) == set(raw)
    for op, cols in raw.items():
        row = rows[op]
        n = cols[0]["group_size"]
        gpu_us = [c["end"] - c["begin"] for c in cols]
        assert (row["count"], row["timed"]) == (len(cols), len(cols))
        assert row["bytes"] == sum(c["bytes"] for c in cols)
        assert row["total_s"] == pytest.approx(sum(gpu_us) * 1e-6, rel=1e-6)  # one rank: duration = its kernels
        assert row["transfer_s"] == pytest.approx(sum(gpu_us) * 1e-6, rel=1e-6)
        algbw = sum(c["bytes"] for c in cols) / (sum(gpu_us) * 1e-6) / 1e9
        assert row["algbw_gbps"] == pytest.approx(algbw, rel=1e-6)
        factor = 2 * (n - 1) / n if op == "all_reduce" else 1.0
        assert row["busbw_gbps"] == pytest.approx(algbw * factor, rel=1e-6)
        queue_us = [c["begin"] - c["enqueue"] for c in cols]
        assert row["queue_mean_s"] == pytest.approx(sum(queue_us) / len(queue_us) * 1e-6, rel=1e-5)


def test_tracelens_mi300_figures(tmp_path):
    """FACTS.md's figures: rank 0's 6 all_reduce kernels take 47.1 ms for 70,137,072 bytes, algbw 1.49 and busbw
    2.60 GB/s; the broadcasts' kernels give 0.92 GB/s. The all-reduces' CPU enqueue to kernel end spans added up
    to 209 ms in an 86.6 ms trace: the GPU queue, now a figure of its own."""
    doc = _report(MI300, tmp_path)
    rows = {r["op"]: r for r in doc["collectives"]}
    reduce, bcast = rows["all_reduce"], rows["broadcast"]
    assert reduce["bytes"] == 70_137_072 and reduce["count"] == 6
    assert round(reduce["total_s"] * 1e3, 1) == 47.1
    assert (round(reduce["algbw_gbps"], 2), round(reduce["busbw_gbps"], 2)) == (1.49, 2.60)
    assert round(bcast["busbw_gbps"], 2) == 0.92
    assert reduce["queue_mean_s"] > 0.02  # 24-31 ms behind the CPU


@pytest.mark.parametrize("path", [MI300, HTA], ids=["tracelens-mi300", "hta-a100"])
def test_one_groups_collectives_never_add_up_to_more_than_their_span(path, tmp_path):
    """The collectives of one group run on one stream, one after another: their durations add up to less than
    the rank's span (the CPU enqueue to kernel end spans added up to 2.4 times the span on MI300)."""
    doc = _report(path, tmp_path)
    by_group = defaultdict(float)
    for row in doc["collectives"]:
        by_group[row["process_group"]] += row["total_s"]
    span = doc["ranks"]["0"]["span_s"]
    assert by_group and all(total <= span for total in by_group.values())


def test_the_merged_trace_draws_each_collective_as_its_gpu_work(tmp_path):
    """The 12 collectives of one group on one stream are one lane of slices, each its kernels' begin to end (not
    9 lanes of CPU-enqueue-to-kernel-end slices), and a flow joins each to its CPU enqueue."""
    out = tmp_path / "mi300.pftrace"
    done = run_cli_process("merge", str(MI300), "-o", str(out), timeout=300)
    assert done.code == 0, done.err
    trace = check_trace(out)
    raw = _raw_collectives(MI300)
    base = json.loads(gzip.open(MI300).read())["baseTimeNanoseconds"]
    lanes = [t.name for t in trace.tracks_of("rank 0") if t.name and t.name.startswith("default_pg")]
    assert lanes == ["default_pg"]
    slices = trace.events_on("default_pg", "rank 0", kind="slice")
    expected = sorted((c["begin"], c["end"], op) for op, cols in raw.items() for c in cols)
    assert [e.name for e in slices] == [op for _, _, op in expected]
    for e, (begin, end, _) in zip(slices, expected):
        assert abs(e.ts - base - begin * 1000) <= 1 and abs(e.ts + e.dur - base - end * 1000) <= 2
    enqueues = [q for _, _, q in sorted((c["begin"], c["end"], c["enqueue"]) for cols in raw.values() for c in cols)]
    for e in slices:
        [flow] = e.flow_ids
        start, end = trace.flows[flow]
        assert (start.name, end) == ("record_param_comms", e)
        assert trace.tracks[start.track].name.startswith("cpu ops")
    starts = [trace.flows[e.flow_ids[0]][0].ts for e in slices]
    assert all(abs(t - base - q * 1000) <= 1 for t, q in zip(starts, enqueues))


NCCL = Path(__file__).resolve().parents[1] / "data" / "nccl"


def test_flight_recorder_gpu_times_are_the_time_on_a_real_h200_run():
    """The H200 run of tests/data/nccl: the report's all_reduce transfer time was 35.6 ms (enqueue to the
    watchdog's discovery) where Flight Recorder's duration_ms summed to 0.45 ms over the 13 retired entries.
    Now the 13 are timed by their duration_ms and the 13 not yet retired are counted, untimed; without
    TORCH_NCCL_ENABLE_TIMING nothing is timed."""
    entries = [e for path in sorted((NCCL / "healthy").glob("rank0.fr-nccl.*.pkl"))
               for e in pickle.loads(path.read_bytes())["entries"]]
    reduces = [e for e in entries if e["profiling_name"] == "nccl:all_reduce"]
    timed = [e["duration_ms"] for e in reduces if e.get("duration_ms") is not None]
    job = load_job([NCCL / "healthy"])
    doc = build_report(job, {})
    [row] = [r for r in doc["collectives"] if r["op"] == "all_reduce"]
    assert (row["count"], row["timed"]) == (len(reduces), len(timed)) == (26, 13)
    assert row["transfer_s"] == pytest.approx(sum(timed) * 1e-3, rel=1e-6)
    assert row["total_s"] == pytest.approx(sum(timed) * 1e-3, rel=1e-6)  # one rank: its GPU time is the duration
    [p2p] = [r for r in doc["collectives"] if r["op"] == "send/recv"]  # enqueue to discovery: 158 ms in all
    assert (p2p["count"], p2p["timed"], p2p["total_s"]) == (12, 0, None)
    table = CollectiveTable(job)  # the table read twice is the same table
    assert table.rows() == table.rows()
    untimed = build_report(load_job([NCCL / "notiming"]), {})
    assert untimed["collectives"] and all(r["timed"] == 0 for r in untimed["collectives"] if r["op"] != "send/recv")
