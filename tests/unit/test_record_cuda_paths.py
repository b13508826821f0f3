"""The recorder's CUDA-facing paths, exercised on this CPU build with stand-ins shaped as torch's own objects:
``--sync`` synchronises the call's device, never during a CUDA graph capture; captures are counted through
``torch.cuda.CUDAGraph.capture_begin/capture_end`` (torch/cuda/graphs.py: ``torch.cuda.graph`` and
``make_graphed_callables`` go through them); during a capture no Flight Recorder dump runs (a dump queries
the entries' CUDA events, torch/csrc/distributed/c10d/FlightRecorderDetail.hpp ``update_state``) and calls are
marked as captured, which readers leave out of matching."""

from __future__ import annotations

import inspect
import os
import time

import orjson
import pytest
import torch
import torch.distributed as dist

import comm2perfetto
from comm2perfetto.record import capture
from comm2perfetto.sources.event_log import read_event_log


class _Graph:
    """Stands in for torch.cuda.CUDAGraph: capture_begin fails when asked to."""

    def capture_begin(self, pool=None, capture_error_mode="global"):
        if capture_error_mode == "fail":
            raise RuntimeError("capture failed")

    def capture_end(self):
        return "ended"


class _FakeTorch:
    class cuda:
        CUDAGraph = _Graph


def test_captures_are_counted_and_the_wrappers_removed():
    capture.install(_FakeTorch)
    try:
        capture.install(_FakeTorch)  # idempotent
        assert _Graph.capture_begin.__wrapped__.__name__ == "capture_begin"
        g = _Graph()
        g.capture_begin()
        assert capture.active == 1
        g.capture_begin(capture_error_mode="relaxed")
        assert capture.active == 2
        assert g.capture_end() == "ended" and g.capture_end() == "ended"
        assert capture.active == 0
        with pytest.raises(RuntimeError, match="capture failed"):
            g.capture_begin(capture_error_mode="fail")
        assert capture.active == 0  # a capture that never began is not counted
    finally:
        capture.uninstall()
    assert not hasattr(_Graph.capture_begin, "__wrapped__")


class _CudaTensor(torch.Tensor):
    """A CPU tensor that says it lives on cuda:1, as the tensor of a rank bound with device_id=cuda:1."""

    @property
    def device(self):
        return torch.device("cuda", 1)


def _one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


@pytest.fixture
def synced(monkeypatch):
    """torch.cuda.is_available() and synchronize(), recorded: what --sync would do on a GPU host."""
    calls: list = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    return calls


def test_sync_waits_on_the_calls_device_and_logs_completion(tmp_path, fr_env, synced):
    out = comm2perfetto.enable(str(tmp_path / "out"), stall_after=None, sync=True)
    try:
        _one_rank()
        try:
            from comm2perfetto.record import state

            rec = state.recorder
            spec = _bound("all_reduce")
            device = rec._extras_before(spec, (torch.ones(2).as_subclass(_CudaTensor),), {})
            rec._extras_after(99, device)
            assert synced == [torch.device("cuda", 1), torch.device("cuda", 1)]
            synced.clear()
            dist.all_reduce(torch.ones(2))  # gloo on CPU: returning is completing, nothing to synchronise
            assert synced == []
            capture.active = 1
            try:
                assert rec._extras_before(spec, (torch.ones(2).as_subclass(_CudaTensor),), {}) is None
            finally:
                capture.active = 0
            assert synced == []  # never during a capture
        finally:
            comm2perfetto.disable()
    finally:
        dist.destroy_process_group()
    log = read_event_log(os.path.join(out, "rank0.events.jsonl"))
    (call,) = log.calls
    assert call.t_done_ns is None and call.t_end_ns == call.t_return_ns


def test_sync_logs_the_return_before_the_synchronisation_and_done_after_it(tmp_path, fr_env, monkeypatch):
    """With --sync, `e` is when torch's function returned (on a GPU: the enqueue) and `d` when the synchronisation
    that follows it did: never before the return (seen 4-5 us before it on an H200 when `e` was stamped after
    the synchronisation)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: time.sleep(0.02))
    out = comm2perfetto.enable(str(tmp_path / "out"), stall_after=None, sync=True)
    try:
        _one_rank()
        try:
            dist.all_reduce(torch.ones(2).as_subclass(_CudaTensor))
        finally:
            comm2perfetto.disable()
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out, "rank0.events.jsonl"), "rb") as f:
        kinds = [r[0] for r in map(orjson.loads, f.read().rstrip(b"\0").splitlines()[1:]) if r[0] in "bed"]
    assert kinds == ["b", "e", "d"]
    (call,) = read_event_log(os.path.join(out, "rank0.events.jsonl")).calls
    assert call.t_done_ns - call.t_return_ns >= 20_000_000  # the synchronisation after the return
    assert call.t_return_ns - call.t_call_ns >= 20_000_000  # and the one before the call


def _bound(name: str):
    """The patch layer's reading of torch's ``name`` (its argument positions)."""
    from comm2perfetto.record import ops

    spec = next(s for s in ops.OPS if s.name == name)
    return ops.BoundSpec(spec, tuple(inspect.signature(getattr(dist.distributed_c10d, name).__wrapped__).parameters))


def test_during_a_capture_calls_are_marked_and_nothing_is_dumped(tmp_path, fr_env):
    out = comm2perfetto.enable(str(tmp_path / "out"), stall_after=None)
    try:
        _one_rank()
        try:
            from comm2perfetto.record import state

            rec = state.recorder
            dist.all_reduce(torch.ones(2))
            capture.active = 1
            try:
                dist.all_reduce(torch.ones(3))
                rec.dump_flight_recorder("periodic")
            finally:
                capture.active = 0
            dist.all_reduce(torch.ones(4))
        finally:
            comm2perfetto.disable()
    finally:
        dist.destroy_process_group()
    log = read_event_log(os.path.join(out, "rank0.events.jsonl"))
    assert [(c.shapes, c.captured) for c in log.calls] == [([[2]], False), ([[3]], True), ([[4]], False)]
    assert [reason for _t, _n, reason in log.fr_dumps] == ["disabled"]  # the periodic one was skipped
    assert any("CUDA graph capture" in w for _t, w in log.warnings)

    from comm2perfetto.match import load_job

    job = load_job([out])
    ((_, cols),) = job.collectives.items()
    # The captured call's seq (2) has only Flight Recorder's entry, which gloo records; the log adds nothing.
    assert [(c.seq, c.sources[0]) for c in cols] == [(1, "fr+log"), (2, "fr"), (3, "fr+log")]
