"""DDP on a real 2-rank gloo job: its collectives are issued from C++ (the Reducer, the initial parameter
broadcast), so the patch layer never sees them and Flight Recorder must have them; the optimizer marks steps;
a Python collective inside a module's forward carries the module path."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from comm2perfetto.record import mechanisms

pytestmark = pytest.mark.integration

# Torch 2.4-2.7 have no Flight Recorder for gloo: the dispatcher fallback records DDP's collectives instead
# (test_record_fallback_ddp.py checks its records).
OLD_TORCH = mechanisms.gloo_fallback_wanted(torch.__version__, {})
needs_gloo_flight_recorder = pytest.mark.skipif(
    OLD_TORCH, reason=f"torch {torch.__version__} has no Flight Recorder for gloo (the fallback's records are "
                      f"checked by test_record_fallback_ddp.py)")

JOB = """
import gc
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class Inner(nn.Module):
    def forward(self, x):
        dist.all_reduce(x)  # @in_forward
        return x


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()

    def forward(self, x):
        return self.inner(x) * 2


dist.init_process_group("gloo")
rank = dist.get_rank()
assert Outer()(torch.ones(3)).tolist() == [4.0] * 3

torch.manual_seed(rank)  # different initial weights: DDP's broadcast must make them equal
model = DistributedDataParallel(nn.Linear(4, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    optimizer.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
weights = [torch.zeros(2, 4) for _ in range(2)]
dist.all_gather(weights, model.module.weight.detach())  # @check
assert torch.equal(weights[0], weights[1]), "DDP replicas diverged"
dist.destroy_process_group()
del model, optimizer  # DDP's reference cycles hold the gloo group: freed while Python is whole (examples/ddp_train.py)
gc.collect()
"""


@pytest.fixture(scope="module")
def ddp_job(module_jobs):
    job = module_jobs.run(JOB, record_args=["--stall-after", "30"])
    assert job.returncode == 0, job.explain()
    return job


def python_calls(log):
    """The calls the patch layer recorded (without the dispatcher fallback's, on torch 2.4-2.7)."""
    return [c for c in log.calls if not c.from_cpp]


def test_the_mechanism_for_ddp_is_the_one_this_torch_needs(ddp_job):
    """By default the dispatcher fallback is installed only where Flight Recorder does not record gloo."""
    for rank in (0, 1):
        log = ddp_job.log(rank)
        cpp = [c.op for c in log.calls if c.from_cpp]
        if OLD_TORCH:
            assert log.header["cpp_collectives"]["gloo"] == "the dispatcher fallback"
            assert Counter(cpp)["all_reduce"] >= 3 and "broadcast" in cpp
        else:  # torch >= 2.8: nothing recorded outside the patch layer, Flight Recorder has DDP's
            assert log.header["cpp_collectives"] == {"gloo": "Flight Recorder", "nccl": "Flight Recorder"}
            assert cpp == []
    assert ("by the dispatcher fallback on gloo" in ddp_job.stderr) is OLD_TORCH


@needs_gloo_flight_recorder
@pytest.mark.parametrize("rank", [0, 1])
def test_cpp_collectives_are_in_flight_recorder_only(ddp_job, rank):
    log = ddp_job.log(rank)
    assert log.closed_reason == "exit" and log.problems == []
    # No group uses NCCL: a CUDA build's NCCL Flight Recorder holds nothing, and gets no file of its own.
    assert ddp_job.fr_dumps(rank) and not list(ddp_job.out.glob(f"rank{rank}.fr-nccl.*"))
    entries = [e for e in ddp_job.fr_entries(rank) if e["process_group"][0] == "0"]
    recorded_seqs = {s for c in log.calls if c.seq is not None for s in range(c.seq, c.seq_last + 1)}
    unrecorded = [e for e in entries if e["collective_seq_id"] not in recorded_seqs]
    names = {e["profiling_name"] for e in unrecorded}
    # DDP's parameter broadcast at construction and its gradient all-reduces in backward.
    assert "gloo:broadcast" in names, names
    assert "gloo:all_reduce" in names, names
    # The patch layer saw only the script's own two calls: none of DDP's.
    assert [(c.op, c.site) for c in log.calls] == [
        ("all_reduce", f"job.py:{ddp_job.line_of('@in_forward')} forward"),
        ("all_gather", f"job.py:{ddp_job.line_of('@check')} <module>"),
    ]
    # Three backward passes, each with at least one gradient all-reduce: all issued by the C++ Reducer.
    backward_all_reduces = [e for e in unrecorded if e["profiling_name"] == "gloo:all_reduce"]
    assert len(backward_all_reduces) >= 3
    # The recorded calls are the FR entries with their sequence numbers (no p2p here: nothing to subtract).
    by_seq = {e["collective_seq_id"]: e for e in entries}
    for call in log.calls:
        assert by_seq[call.seq]["profiling_name"] == f"gloo:{call.op}"
        assert by_seq[call.seq]["input_sizes"] == call.shapes


@pytest.mark.parametrize("rank", [0, 1])
def test_optimizer_steps_are_recorded(ddp_job, rank):
    log = ddp_job.log(rank)
    assert [(step, source) for step, _t, source in log.steps] == [(1, "optimizer"), (2, "optimizer"),
                                                                 (3, "optimizer")]
    times = [t for _step, t, _source in log.steps]
    assert times == sorted(times)
    forward_call, check_call = python_calls(log)
    assert forward_call.step == 0  # before the first optimizer step
    assert check_call.step == 3
    assert times[-1] < check_call.t_call_ns


@pytest.mark.parametrize("rank", [0, 1])
def test_module_path_and_pass_of_a_collective_in_forward(ddp_job, rank):
    forward_call, check_call = python_calls(ddp_job.log(rank))
    assert forward_call.module == "Outer.inner"
    assert forward_call.pass_ == "forward"
    assert forward_call.shapes == [[3]]
    assert (check_call.module, check_call.pass_) == (None, None)


@needs_gloo_flight_recorder
def test_closing_summary_counts_what_each_source_saw(ddp_job):
    """record's last lines: the patch layer's calls and Flight Recorder's entries (DDP's among them)."""
    from comm2perfetto.sources.summary import counts_text

    calls = Counter(c.op for rank in (0, 1) for c in ddp_job.log(rank).calls)
    entries = Counter(e["profiling_name"].split(":", 1)[1] for rank in (0, 1) for e in ddp_job.fr_entries(rank))
    assert calls == Counter({"all_reduce": 2, "all_gather": 2})
    assert entries["broadcast"] >= 2 and entries["all_reduce"] >= 2 + 2 * 3  # DDP's, beside the script's
    assert f"torch.distributed calls (patch layer): {counts_text(calls)}" in ddp_job.stderr
    assert f"Flight Recorder entries (also C++-issued): {counts_text(entries)}" in ddp_job.stderr
    assert "recorded 2 rank(s) into" in ddp_job.stderr
