"""The nn.Module and pass each recorded call is attributed to, in-process on a one-rank gloo group.

The reference is torch's own CommDebugMode, run around the same code: every call must land in the module
CommDebugMode counts it in (its leaf count), in forward hooks, in the parent between children, in backward
(autograd Functions whose backward all-reduces) and in a forward recomputed by activation checkpointing.
Tracking must not change what training computes: no backward hooks on modules (in-place ops on module
outputs keep working), and ``modules=False`` installs no hook at all.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules import module as nn_module
from torch.utils.checkpoint import checkpoint

import comm2perfetto
from comm2perfetto.record.recorder import MODULES_GRACE_STEPS
from comm2perfetto.sources.event_log import read_event_log

try:
    from torch.distributed.tensor.debug import CommDebugMode
except ImportError:  # torch 2.4: torch.distributed._tensor.debug's CommDebugMode counts no modules
    CommDebugMode = None
needs_comm_debug_mode = pytest.mark.skipif(
    CommDebugMode is None, reason=f"torch {torch.__version__}: CommDebugMode counts per module from torch 2.5 on")


@pytest.fixture
def recording(tmp_path, monkeypatch):
    """Record into tmp_path/out on a one-rank group; yields a function returning the calls so far."""
    for key in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE",
                "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "COMM2PERFETTO_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    out = str(tmp_path / "out")
    state = {"modules": True}

    def start(modules: bool = True) -> None:
        state["modules"] = modules
        comm2perfetto.enable(out, stall_after=None, modules=modules)
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    def calls() -> list:
        comm2perfetto.disable()
        dist.destroy_process_group()
        log = read_event_log(os.path.join(out, "rank0.events.jsonl"))
        assert log.problems == []
        return log.calls

    yield start, calls
    if dist.is_initialized():
        comm2perfetto.disable()
        dist.destroy_process_group()


class AllReduceInBackward(torch.autograd.Function):
    """Identity whose backward all-reduces the gradient (what DTensor's redistributions do)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(grad)
        return grad


class Leaf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return AllReduceInBackward.apply(self.lin(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Leaf()
        self.b = Leaf()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = AllReduceInBackward.apply(x * 2)  # its backward runs after a's: CommDebugMode says a.lin
        dist.all_reduce(torch.ones(1))  # the parent's own forward
        return self.b(self.a(x))


def leaf_counts(comm: CommDebugMode) -> Counter:
    """(module, pass) -> count of the module each collective was issued in: CommDebugMode also adds it to every
    parent and to "Global", so each module's children's counts are taken off."""
    totals = {m: {p: sum(ops.values()) for p, ops in passes.items()} for m, passes in comm.comm_module_counts.items()}
    leaves: Counter = Counter()
    for module, passes in totals.items():
        children = [m for m in totals if m != module and
                    (m.rsplit(".", 1)[0] == module if "." in m else module == "Global")]
        for pass_, count in passes.items():
            own = count - sum(totals[c].get(pass_, 0) for c in children)
            if own:
                leaves[(None if module == "Global" else module, pass_)] = own
    return leaves


def recorded_counts(calls: list) -> Counter:
    return Counter((c.module, c.pass_ or "forward") for c in calls)


@needs_comm_debug_mode
def test_forward_hooks_parent_code_and_backward_agree_with_comm_debug_mode(recording):
    start, calls = recording
    start()
    torch.manual_seed(0)
    net = Net()
    net.a.register_forward_hook(lambda mod, args, out: dist.all_reduce(torch.ones(2)))  # like RowwiseParallel's
    net.b.register_forward_pre_hook(lambda mod, args: dist.all_reduce(torch.ones(3)))  # like an input hook
    x = torch.randn(2, 4, requires_grad=True)
    with CommDebugMode() as comm:
        net(x).sum().backward()
    expected = leaf_counts(comm)
    assert expected == Counter({("Net", "forward"): 1, ("Net.a", "forward"): 1, ("Net.b", "forward"): 1,
                                ("Net.b", "backward"): 1, ("Net.a", "backward"): 1,
                                ("Net.a.lin", "backward"): 1})
    assert recorded_counts(calls()) == expected


@needs_comm_debug_mode
def test_a_hook_added_after_the_first_forward_still_runs_inside_the_module(recording):
    """Our hook that ends a module's call moves behind hooks registered later."""
    start, calls = recording
    start()
    net = Net()
    x = torch.randn(2, 4)
    net.a.register_forward_hook(lambda mod, args, out: None)
    net(x)
    net.a.register_forward_hook(lambda mod, args, out: dist.all_reduce(torch.ones(5)))
    with CommDebugMode() as comm:
        net(x)
    expected = leaf_counts(comm)
    assert expected == Counter({("Net", "forward"): 1, ("Net.a", "forward"): 1})
    recorded = calls()
    assert [(c.module, c.pass_) for c in recorded] == [("Net", "forward")] + [("Net", "forward"),
                                                                              ("Net.a", "forward")]


@needs_comm_debug_mode
def test_activation_checkpointing_recomputation_keeps_the_module_path(recording):
    """A forward recomputed in backward: its collectives are the module's, in the backward pass (as
    CommDebugMode counts them), with the module's full path although it runs outside its parent."""
    start, calls = recording
    start()

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            dist.all_reduce(torch.ones(1))  # once in forward, once more when recomputed
            return self.lin(x)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = Block()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return checkpoint(self.block, x, use_reentrant=False)

    model = Model()
    with CommDebugMode() as comm:
        model(torch.randn(2, 4, requires_grad=True)).sum().backward()
    expected = leaf_counts(comm)
    assert expected == Counter({("Model.block", "forward"): 1, ("Model.block", "backward"): 1})
    assert recorded_counts(calls()) == expected


def test_in_place_ops_on_module_outputs_keep_working(recording):
    """No backward hooks on modules: outputs are not wrapped in views, so in-place ops on them work (they
    raise under module full backward hooks)."""
    start, calls = recording
    start()
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), Leaf())
    x = torch.randn(2, 4, requires_grad=True)
    out = model(x)
    out.mul_(2)
    out.sum().backward()
    assert x.grad is not None
    assert [(c.module, c.pass_) for c in calls()] == [("Sequential.2", "backward")]


def test_an_exception_in_forward_leaves_the_module_stack_empty(recording):
    start, calls = recording
    start()

    class Fails(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("boom")

    model = nn.Sequential(Fails())
    model[0].register_forward_hook(lambda mod, args, out: None)  # our local hook runs on the way out too
    with pytest.raises(ValueError, match="boom"):
        model(torch.ones(1))
    dist.all_reduce(torch.ones(1))
    assert [(c.module, c.pass_) for c in calls()] == [(None, None)]


def test_modules_off_installs_no_hook(recording):
    start, calls = recording
    before = (dict(nn_module._global_forward_pre_hooks), dict(nn_module._global_forward_hooks))
    start(modules=False)
    assert (dict(nn_module._global_forward_pre_hooks), dict(nn_module._global_forward_hooks)) == before
    net = Net()
    net(torch.randn(2, 4, requires_grad=True)).sum().backward()
    assert Counter((c.module, c.pass_) for c in calls()) == Counter({(None, None): 1, (None, "backward"): 3})


def test_tracking_switches_off_when_it_has_nothing_to_attribute(recording):
    """DDP-like: the steps' collectives are not the patch layer's; after MODULES_GRACE_STEPS optimizer steps
    the hooks come off, with a warning in the log."""
    start, calls = recording
    before = (dict(nn_module._global_forward_pre_hooks), dict(nn_module._global_forward_hooks))
    start()
    model = nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(MODULES_GRACE_STEPS + 1):
        assert (len(nn_module._global_forward_pre_hooks) > len(before[0])) == (step < MODULES_GRACE_STEPS), step
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
    dist.all_reduce(torch.ones(1))  # outside modules, as before
    assert (dict(nn_module._global_forward_pre_hooks), dict(nn_module._global_forward_hooks)) == before
    assert [(c.module, c.pass_, c.step) for c in calls()] == [(None, None, MODULES_GRACE_STEPS + 1)]


def test_tracking_stays_on_once_it_attributed_a_call(recording):
    start, calls = recording
    start()
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(MODULES_GRACE_STEPS + 2):
        model(torch.randn(2, 4, requires_grad=True)).sum().backward()  # Net's forward all-reduces
        optimizer.step()
    assert {(c.module, c.pass_) for c in calls()} == {("Net", "forward"), ("Net.a", "backward"),
                                                      ("Net.b", "backward"), ("Net.a.lin", "backward")}
