"""The dispatcher fallback on a real 2-rank gloo DDP job under ``comm2perfetto record``: DDP's collectives,
issued from C++ (its constructor's shape check and parameter broadcast, its Reducer's gradient all-reduces in
backward), are in the event log with the patch layer's fields, each exactly once, numbered as Flight Recorder
numbers them. Torch 2.4-2.7 install the fallback by default (no Flight Recorder for gloo there); on newer torch
(CI) it is forced by its internal switch, and Flight Recorder's entries check every record."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from comm2perfetto.record import mechanisms
from support.cli import run_cli_process

pytestmark = pytest.mark.integration

OLD_TORCH = mechanisms.gloo_fallback_wanted(torch.__version__, {})
STEPS = 3

JOB = """
import gc
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)  # different initial weights: DDP's broadcast must make them equal
model = DistributedDataParallel(nn.Linear(4, 2))  # @ctor
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    optimizer.zero_grad()
    loss = model(torch.full((8, 4), float(rank + step))).sum()  # @forward
    loss.backward()  # @backward
    optimizer.step()
weights = [torch.zeros(2, 4) for _ in range(2)]
dist.all_gather(weights, model.module.weight.detach())  # @check
assert torch.equal(weights[0], weights[1]), "DDP replicas diverged"
dist.destroy_process_group()
del model, optimizer  # DDP's reference cycles hold the gloo group: freed while Python is whole (examples/ddp_train.py)
gc.collect()
"""


@pytest.fixture(scope="module")
def job(module_jobs):
    result = module_jobs.run(JOB, record_args=["--stall-after", "30"],
                             env={mechanisms.ENV_FALLBACK: "force"})
    assert result.returncode == 0, result.explain()
    return result


def _cpp(job, rank):
    return [c for c in job.log(rank).calls if c.from_cpp]


def test_the_start_up_line_and_the_summary_name_the_fallback(job):
    assert "by the dispatcher fallback on gloo" in job.stderr
    counts = Counter(c.op for rank in (0, 1) for c in _cpp(job, rank))
    from comm2perfetto.sources.summary import counts_text

    assert f"C++-issued collectives (dispatcher fallback): {counts_text(counts)}" in job.stderr
    assert "torch.distributed calls (patch layer): 2 (all_gather 2)" in job.stderr


@pytest.mark.parametrize("rank", [0, 1])
def test_ddp_collectives_are_recorded_with_their_fields(job, rank):
    log = job.log(rank)
    assert log.closed_reason == "exit" and log.problems == []
    assert log.header["cpp_collectives"]["gloo"] == "the dispatcher fallback"
    cpp = _cpp(job, rank)
    ctor = [c for c in cpp if c.site.startswith(f"job.py:{job.line_of('@ctor')} ")]
    # The constructor's parameter shape check (an all-gather, a broadcast) and its parameter broadcast.
    assert [c.op for c in ctor] == ["all_gather", "broadcast", "broadcast"]
    assert all(c.peer == 0 for c in ctor if c.op == "broadcast")  # from rank 0, a global rank
    gradients = [c for c in cpp if c.op == "all_reduce"]
    assert len(gradients) == STEPS  # one bucket: one all-reduce per backward
    for step, c in enumerate(gradients):
        assert c.site == f"job.py:{job.line_of('@backward')} <module>"
        assert (c.pass_, c.module, c.step) == ("backward", None, step)
        assert (c.shapes, c.dtypes, c.nbytes) == ([[10]], ["Float"], 40)  # the bucket: 8 weights, 2 biases
    # DDP rebuilds its buckets in the second forward and broadcasts the new order from rank 0.
    assert {c.site for c in cpp} <= {f"job.py:{job.line_of(m)} <module>" for m in ("@ctor", "@forward", "@backward")}
    for c in cpp:
        assert c.is_async and c.error is None and log.groups[c.gid].name == "0"
        assert c.t_call_ns <= c.t_return_ns <= c.t_done_ns  # enqueued, then completed on gloo's thread


@pytest.mark.parametrize("rank", [0, 1])
def test_every_collective_is_recorded_once_in_sequence(job, rank):
    """The fallback's records and the patch layer's together are the group's collectives 1..N, none twice:
    the script's all_gather, recorded by the patch layer, passes the fallback's kernel unrecorded."""
    calls = job.log(rank).calls
    assert sorted(c.seq for c in calls) == list(range(1, len(calls) + 1))
    (check,) = [c for c in calls if not c.from_cpp]
    assert (check.op, check.seq, check.site) == ("all_gather", len(calls), f"job.py:{job.line_of('@check')} <module>")


def test_the_ranks_agree_and_diagnose_finds_nothing_wrong(job):
    signature = [[(c.seq, c.op, c.shapes) for c in job.log(rank).calls] for rank in (0, 1)]
    assert signature[0] == signature[1]
    proc = run_cli_process("diagnose", str(job.out), "--format", "json", timeout=120)
    doc = json.loads(proc.out)
    assert (proc.code, doc["status"], doc["findings"]) == (0, "ok", [])


@pytest.mark.parametrize("rank", [0, 1])
def test_each_record_is_flight_recorders_entry_of_the_same_number(job, rank):
    if OLD_TORCH:
        pytest.skip(f"torch {torch.__version__} has no Flight Recorder for gloo to compare with")
    entries = {e["collective_seq_id"]: e for e in job.fr_entries(rank) if e["process_group"][0] == "0"}
    cpp = _cpp(job, rank)
    assert {c.seq for c in cpp} <= set(entries)
    for c in cpp:
        assert entries[c.seq]["profiling_name"] == f"gloo:{c.op}"
        assert entries[c.seq]["input_sizes"] == c.shapes
