"""Recording inside the test process with ``comm2perfetto.enable()``/``disable()`` on a one-rank gloo group:
torch.cuda.nvtx mirroring (through a stand-in for its C library, which CPU builds lack), recording
started after ``init_process_group``, and ``comm2perfetto.step()``. Each test must leave nothing installed
(checked by the autouse fixture in conftest.py)."""

from __future__ import annotations

import inspect
import os

import pytest
import torch
import torch.cuda.nvtx as torch_nvtx
import torch.distributed as dist

import comm2perfetto
from comm2perfetto.sources.event_log import read_event_log


class FakeNvtxLibrary:
    """Stands in for ``torch.cuda.nvtx._nvtx`` (torch._C._nvtx on CUDA builds)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def rangePushA(self, message):
        self.calls.append(("push", message))
        return len([c for c in self.calls if c[0] == "push"]) - 1

    def rangePop(self):
        self.calls.append(("pop",))
        return 0

    def markA(self, message):
        self.calls.append(("mark", message))


@pytest.fixture
def fr_env(monkeypatch):
    """enable() writes Flight Recorder settings into os.environ: put them back afterwards."""
    for key in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE",
                "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "COMM2PERFETTO_RUN_ID"):
        monkeypatch.delenv(key, raising=False)


def _init_one_rank() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def _here() -> int:
    return inspect.currentframe().f_back.f_lineno


def test_torch_cuda_nvtx_ranges_are_mirrored(tmp_path, monkeypatch, fr_env):
    fake = FakeNvtxLibrary()
    monkeypatch.setattr(torch_nvtx, "_nvtx", fake)  # before recording starts: mirroring wraps what it finds
    out = comm2perfetto.enable(str(tmp_path / "out"), stall_after=None)
    assert out == str(tmp_path / "out")
    try:
        _init_one_rank()
        try:
            with torch_nvtx.range("outer_{}", "torch"):
                assert torch_nvtx.range_push("inner_torch") == 1  # the library's return value comes through
                t = torch.ones(2)
                dist.all_reduce(t); line = _here()
                assert torch_nvtx.range_pop() == 0
            torch_nvtx.mark("torch_mark")
        finally:
            comm2perfetto.disable()
    finally:
        dist.destroy_process_group()
    assert torch_nvtx._nvtx is fake  # mirroring removed
    # The library itself was called for every range, as without recording.
    assert fake.calls == [("push", "outer_torch"), ("push", "inner_torch"), ("pop",), ("pop",),
                          ("mark", "torch_mark")]

    log = read_event_log(os.path.join(out, "rank0.events.jsonl"))
    assert log.problems == [] and log.closed_reason == "disabled"
    assert [(r.name, r.source) for r in log.ranges] == [("outer_torch", "torch.cuda.nvtx"),
                                                        ("inner_torch", "torch.cuda.nvtx")]
    outer, inner = log.ranges
    assert outer.t_begin_ns <= inner.t_begin_ns <= inner.t_end_ns <= outer.t_end_ns
    ((_t, name, _tid, source),) = log.marks
    assert (name, source) == ("torch_mark", "torch.cuda.nvtx")
    (call,) = log.calls
    assert call.op == "all_reduce" and call.nvtx == ("outer_torch", "inner_torch")
    assert call.site.endswith(f"test_record_inprocess.py:{line} test_torch_cuda_nvtx_ranges_are_mirrored")
    assert inner.t_begin_ns <= call.t_call_ns <= call.t_return_ns <= inner.t_end_ns
    assert [reason for _t, _n, reason in log.fr_dumps] == ["disabled"]


def test_torch_cuda_nvtx_behaves_as_without_recording(tmp_path, fr_env):
    """torch.cuda.nvtx raises on CPU builds and works on CUDA builds (also without a GPU). Mirrored, it does
    the same: raises the same error and records nothing, or works and records the range."""
    try:
        torch_nvtx.range_push("probe")
        torch_nvtx.range_pop()
        unrecorded = None
    except RuntimeError as exc:
        unrecorded = exc
    out = comm2perfetto.enable(str(tmp_path / "out"), stall_after=None)
    try:
        _init_one_rank()
        try:
            if unrecorded is None:
                torch_nvtx.range_push("x")
                dist.all_reduce(torch.ones(1))
                torch_nvtx.range_pop()
            else:
                with pytest.raises(RuntimeError) as recorded:
                    torch_nvtx.range_push("x")
                dist.all_reduce(torch.ones(1))
        finally:
            comm2perfetto.disable()
    finally:
        dist.destroy_process_group()
    log = read_event_log(os.path.join(out, "rank0.events.jsonl"))
    if unrecorded is None:
        assert [(r.name, r.source) for r in log.ranges] == [("x", "torch.cuda.nvtx")]
        assert log.calls[0].nvtx == ("x",)
    else:
        assert str(recorded.value) == str(unrecorded)
        assert log.ranges == [] and log.calls[0].nvtx == ()


def test_enable_after_init_and_user_steps(tmp_path, fr_env, capsys):
    from comm2perfetto.record.flight import flight_recorder_off_by_default

    _init_one_rank()
    try:
        dist.all_reduce(torch.ones(3))  # before enable: not recorded
        out = comm2perfetto.enable(str(tmp_path / "out"), stall_after=None)
        try:
            dist.all_reduce(torch.ones(4))
            comm2perfetto.step()
            dist.broadcast(torch.ones(5), src=0)
            comm2perfetto.step()
        finally:
            comm2perfetto.disable()
        dist.all_reduce(torch.ones(6))  # after disable: not recorded
    finally:
        dist.destroy_process_group()
    log = read_event_log(os.path.join(out, "rank0.events.jsonl"))
    assert log.problems == [] and log.closed_reason == "disabled"
    assert [(c.op, c.shapes, c.step, c.seq) for c in log.calls] == [("all_reduce", [[4]], 0, 2),
                                                                  ("broadcast", [[5]], 1, 3)]
    assert [(step, source) for step, _t, source in log.steps] == [(1, "user"), (2, "user")]
    assert log.header["config"]["stall_after_s"] is None
    # Torch 2.8-2.10 read Flight Recorder's buffer size at the first group only: enable() came too late for it.
    warned = "Flight Recorder is off on this torch unless TORCH_FR_BUFFER_SIZE" in capsys.readouterr().err
    assert warned == flight_recorder_off_by_default(torch.__version__)


def test_enable_refuses_an_unusable_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="exists and is not a folder; choose another output folder"):
        comm2perfetto.enable(str(tmp_path / "file"))
