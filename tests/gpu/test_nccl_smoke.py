"""NCCL on a real GPU: the smoke suite to run wherever a GPU is at hand (skipped without CUDA).

Run it with ``python -m pytest tests/gpu -v`` on a machine with one GPU (world size 1) or more (world size 2).
It checks what CPU-only CI cannot: on NCCL an async call is not logged done at enqueue and Flight Recorder says
when it completed; collectives carry a GPU duration with timing on and none with ``--no-gpu-timing``; ``--sync``
logs measured completions; periodic dumps happen and what they cost a step (printed); a CUDA Kineto trace goes
through ``report`` and ``merge``. With ``COMM2PERFETTO_SAVE_FIXTURES=DIR`` each job's folder is copied there, to
keep small real NCCL dumps and CUDA traces as test fixtures.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or not torch.distributed.is_nccl_available():
    pytest.skip("needs a CUDA GPU and NCCL", allow_module_level=True)

from support.jobs import job_env  # noqa: E402  # after the skip: a machine without CUDA stops above

pytestmark = pytest.mark.integration
NPROC = min(torch.cuda.device_count(), 2)

JOB = """
import os, sys, time
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

local = int(os.environ["LOCAL_RANK"])
device = torch.device("cuda", local)
dist.init_process_group("nccl", device_id=device)  # no set_device: --sync must use the call's device
x = torch.ones(1 << 20, device=device)
work = dist.all_reduce(x, async_op=True)  # @async
work.wait()
dist.all_reduce(x)  # @sync_call
model = DistributedDataParallel(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8)).to(device))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps = int(os.environ.get("STEPS", "20"))
torch.cuda.synchronize(device)
t0 = time.perf_counter()
for _ in range(steps):
    opt.zero_grad()
    model(torch.randn(64, 256, device=device)).sum().backward()
    opt.step()
torch.cuda.synchronize(device)
print(f"step_ms={(time.perf_counter() - t0) * 1000 / steps:.3f}", flush=True)
dist.destroy_process_group()
"""


def _record(tmp_path, *record_args: str, steps: int = 20):
    (tmp_path / "job.py").write_text(JOB)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "comm2perfetto.cli", "record", "-o", str(out), *record_args, "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(NPROC), "job.py"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=job_env(STEPS=str(steps)), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    save = os.environ.get("COMM2PERFETTO_SAVE_FIXTURES")
    if save:
        shutil.copytree(out, os.path.join(save, tmp_path.name), dirs_exist_ok=True)
    return out, proc


def _fr_entries(out, rank=0):
    entries = {}
    for path in sorted(out.glob(f"rank{rank}.fr*.pkl")):
        with open(path, "rb") as f:  # this job's own dump
            for e in pickle.load(f).get("entries", []):
                entries[(e["pg_id"], e["record_id"])] = e
    return list(entries.values())


def test_async_nccl_work_is_completed_by_flight_recorder_not_at_enqueue(tmp_path):
    from comm2perfetto.sources.event_log import read_event_log

    out, _ = _record(tmp_path)
    log = read_event_log(out / "rank0.events.jsonl")
    async_call, sync_call = log.calls[:2]
    assert async_call.is_async and async_call.t_done_ns is None  # no `d` from the enqueue-time future
    assert not sync_call.is_async and sync_call.t_done_ns is None
    entries = [e for e in _fr_entries(out) if not e.get("is_p2p")]
    assert entries and all(e["state"] == "completed" for e in entries)
    assert all(isinstance(e.get("duration_ms"), float) for e in entries if e.get("retired"))  # timing on
    diag = subprocess.run([sys.executable, "-m", "comm2perfetto.cli", "diagnose", str(out)], capture_output=True,
                          text=True)
    assert diag.returncode == 0, diag.stdout + diag.stderr


def test_no_gpu_timing_leaves_durations_out(tmp_path):
    out, _ = _record(tmp_path, "--no-gpu-timing", steps=3)
    assert not any(e.get("duration_ms") for e in _fr_entries(out))


def test_sync_logs_measured_completions(tmp_path):
    from comm2perfetto.sources.event_log import read_event_log

    out, _ = _record(tmp_path, "--sync", steps=3)
    log = read_event_log(out / "rank0.events.jsonl")
    assert all(c.t_done_ns is not None and c.t_done_ns >= c.t_return_ns for c in log.calls[:2])


def test_periodic_dumps_and_their_cost(tmp_path, capsys):
    """A 64-entry ring makes DDP's step boundaries dump often; the step time is printed beside the default
    ring's (a figure, not an assertion)."""
    from comm2perfetto.sources.event_log import read_event_log

    times = {}
    for ring in ("20000", "64"):
        (tmp_path / ring).mkdir()
        out, proc = _record(tmp_path / ring, "--fr-buffer", ring, steps=200)
        times[ring] = float(proc.stdout.strip().splitlines()[-1].split("=")[1])
        reasons = [reason for _t, _n, reason in read_event_log(out / "rank0.events.jsonl").fr_dumps]
        assert ("periodic" in reasons) == (ring == "64")
    with capsys.disabled():
        print(f"\nDDP step: {times['20000']:.3f} ms with the default ring, {times['64']:.3f} ms with a 64-entry ring "
              f"(periodic dumps): {times['64'] / times['20000']:.2f}x")


def test_cuda_kineto_trace_through_report_and_merge(tmp_path):
    out, _ = _record(tmp_path, "--profile-steps", "3-5", steps=10)
    traces = sorted(out.glob("rank0.kineto.*.json.gz"))
    assert traces
    report = subprocess.run([sys.executable, "-m", "comm2perfetto.cli", "report", str(out), "--format", "json"],
                            capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    merged = tmp_path / "job.pftrace"
    merge = subprocess.run([sys.executable, "-m", "comm2perfetto.cli", "merge", str(out), "-o", str(merged)],
                           capture_output=True, text=True)
    assert merge.returncode in (0, 1), merge.stderr
    from comm2perfetto.trace.check import check_trace

    check_trace(merged)
