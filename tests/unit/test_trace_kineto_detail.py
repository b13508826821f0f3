"""What opening one raw profiler trace in Perfetto shows survives the merge: every kernel's and CPU op's args
(grid, block, registers, Input Dims ...), their External and correlation ids, and the flow from each CPU launch
to its GPU work (Kineto's ``ac2g`` flow events). Checked on the public traces in tests/data/kineto against
what the raw JSON says, by decoding the merged .pftrace; ``--lean`` leaves all three out."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import orjson
import pytest

from comm2perfetto.sources.kineto.events import SHOWN_ARG_SET
from comm2perfetto.trace.check import DecodedTrace, check_trace
from support.cli import run_cli

DATA = Path(__file__).resolve().parents[1] / "data" / "kineto"
# (file, the rank to give a trace that does not say its own)
TRACES = [("hta_nccl_data.json.gz", 0), ("tracelens_b200_eager_trace.json.gz", None)]
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# Per-event indices of the profiler's own, left out on purpose (sources/kineto/events.py, NOT_DETAIL)
INTERNAL = {"Ev Idx", "Record function id", "Python id", "Python parent id"}



def _raw(name: str) -> list[dict]:
    return orjson.loads(gzip.decompress((DATA / name).read_bytes()))["traceEvents"]


def _merged(tmp_path: Path, name: str, rank: int | None, *extra: str) -> tuple[DecodedTrace, str]:
    """The merged trace of one public trace, and the summary merge printed."""
    folder = tmp_path / "traces"
    folder.mkdir(exist_ok=True)
    shutil.copy(DATA / name, folder / name)
    out = tmp_path / "job.pftrace"
    argv = ["merge", str(folder), "-o", str(out), *extra]
    if rank is not None:
        argv += ["--trace-rank", f"{folder / name}={rank}"]
    code, summary, err = run_cli(*argv)
    assert code == 0, err
    return check_trace(out), summary


def _as_shown(value):
    """A raw arg's value as merge writes it: lists and objects as their JSON text."""
    return orjson.dumps(value).decode() if isinstance(value, (list, dict)) else value


@pytest.mark.parametrize(("name", "rank"), TRACES)
def test_every_launch_to_kernel_flow_of_the_raw_trace_is_in_the_merged_one(tmp_path, name, rank):
    raw = _raw(name)
    starts = {e["id"] for e in raw if e.get("ph") == "s" and e.get("cat") == "ac2g"}
    ends = {e["id"] for e in raw if e.get("ph") == "f" and e.get("cat") == "ac2g"}
    # Kineto's flow id is the correlation id: launch name and GPU event name of each flow the raw trace draws
    by_corr: dict[int, dict[str, str]] = {}
    for e in raw:
        corr = (e.get("args") or {}).get("correlation")
        if e.get("ph") == "X" and corr in starts & ends:
            by_corr.setdefault(corr, {})["gpu" if e.get("cat") in GPU_CATEGORIES else "cpu"] = e["name"]
    expected = {corr: (names["cpu"], names["gpu"]) for corr, names in by_corr.items()}
    assert len(expected) == len(starts & ends) > 900

    trace, _ = _merged(tmp_path, name, rank)
    found = {}
    for events in trace.flows.values():
        if len(events) != 2 or "correlation" not in events[0].args:
            continue  # a collective's flow across ranks
        launch, work = events
        assert launch.args["correlation"] == work.args["correlation"]
        found[launch.args["correlation"]] = (launch.name, work.name)
    assert found == expected


@pytest.mark.parametrize(("name", "rank"), TRACES)
def test_kernel_and_cpu_op_args_and_ids_are_those_of_the_raw_trace(tmp_path, name, rank):
    raw = _raw(name)
    trace, _ = _merged(tmp_path, name, rank)
    # every GPU event and every CPU op carrying an External id, keyed as the raw trace keys them
    decoded = {}
    for e in trace.events:
        if e.kind == "slice" and "External id" in e.args:
            decoded.setdefault((e.name, e.args["External id"], e.args.get("correlation")), []).append(e)
    checked = {"gpu": 0, "cpu": 0}
    for e in raw:
        args = e.get("args") or {}
        if e.get("ph") != "X" or "External id" not in args or e.get("cat") not in (*GPU_CATEGORIES, "cpu_op"):
            continue
        matches = decoded.get((e["name"], args["External id"], args.get("correlation")))
        if matches is None:  # an op of a thread merge does not draw (not a training thread)
            assert e.get("cat") == "cpu_op", e
            continue
        shown = {k: _as_shown(v) for k, v in args.items() if k not in INTERNAL | {"device", "stream"}}
        assert any(shown.items() <= m.args.items() for m in matches), (e, [m.args for m in matches])
        checked["gpu" if e.get("cat") in GPU_CATEGORIES else "cpu"] += 1
    assert checked["gpu"] > 900 and checked["cpu"] > 4000, checked
    kernel = next(e for e in trace.events if e.category == "compute")
    assert {"grid", "block", "registers per thread", "External id", "correlation", "class"} <= set(kernel.args)


def test_lean_leaves_the_detail_out(tmp_path):
    name, rank = TRACES[1]
    trace, out = _merged(tmp_path, name, rank, "--lean")
    # No launch-to-kernel flow is left; what remains links each collective's CPU enqueue to its GPU slice
    # (merge's own, not Kineto's detail).
    assert f" {len(trace.flows):,} flows;" in out
    for start, end in trace.flows.values():
        assert start.name == "record_param_comms" and end.category == "collective", (start, end)
    kernels = [e for e in trace.events if e.category in ("compute", "comm", "memory")]
    # as before merge kept the detail: the class, and what tells a collective or a copy (SHOWN_ARGS)
    assert kernels and all(set(e.args) - {"class"} <= SHOWN_ARG_SET for e in kernels)
    assert not any("Input Dims" in e.args or "External id" in e.args for e in trace.events)
