"""The dispatcher fallback (record/dispatch.py, recorder.dispatcher_kernel), in the test process on a one-rank
gloo group: the collectives DDP issues from C++ are recorded with the patch layer's fields, Python calls once,
and it is installed only where torch needs it. On torch >= 2.8 (CI) it is forced by its internal switch; the
compatibility matrix (tests/compat/run_matrix.sh) runs the same tests on 2.4 to 2.7, where it is the default."""

from __future__ import annotations

import inspect
import os
import pickle

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import comm2perfetto
from comm2perfetto.record import dispatch, mechanisms
from comm2perfetto.record.config import ENV_FAULT
from comm2perfetto.record.recorder import _backend_counter
from comm2perfetto.sources.event_log import read_event_log

OLD_TORCH = mechanisms.gloo_fallback_wanted(torch.__version__, {})  # 2.4-2.7: the fallback is the default


def _here() -> int:
    return inspect.currentframe().f_back.f_lineno


def _record(tmp_path, job, backend: str | None = "gloo") -> tuple:
    """Run ``job()`` recorded by ``enable()`` on a one-rank group; returns the event log and what ``job``
    returned."""
    out = comm2perfetto.enable(str(tmp_path / "out"), stall_after=None)
    try:
        if backend is None:
            dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        try:
            result = job()
        finally:
            comm2perfetto.disable()
    finally:
        dist.destroy_process_group()
    return read_event_log(os.path.join(out, "rank0.events.jsonl")), result


@pytest.fixture
def forced(monkeypatch, fr_env):
    monkeypatch.setenv(mechanisms.ENV_FALLBACK, "force")


def _ddp_job() -> dict:
    lines = {}
    model = DistributedDataParallel(nn.Linear(4, 2)); lines["ctor"] = _here()  # noqa: E702
    lines["installed"] = dispatch.installed()
    model(torch.ones(8, 4)).sum().backward(); lines["backward"] = _here()  # noqa: E702
    lines["grad"] = model.module.bias.grad.tolist()
    dist.all_reduce(torch.ones(3)); lines["python"] = _here()  # noqa: E702
    return lines


def test_ddp_collectives_issued_from_cpp_are_recorded_with_their_fields(tmp_path, forced):
    log, lines = _record(tmp_path, _ddp_job)
    assert lines["installed"] and not dispatch.installed()  # taken off by disable()
    assert log.problems == [] and log.header["cpp_collectives"]["gloo"] == "the dispatcher fallback"
    cpp = [c for c in log.calls if c.from_cpp]
    # DDP's constructor: the parameter shape check's all-gather, then the broadcasts of its shape check and of
    # _broadcast_coalesced; backward: the bucket's gradient all-reduce.
    assert [c.op for c in cpp] == ["all_gather", "broadcast", "broadcast", "all_reduce"]
    this = "test_record_fallback.py"
    sites = [c.site.split(" ")[0].rsplit("/", 1)[-1] for c in cpp]
    assert sites == [f"{this}:{lines['ctor']}"] * 3 + [f"{this}:{lines['backward']}"]
    assert [c.pass_ for c in cpp] == [None, None, None, "backward"]
    assert all(c.module is None and not c.functional for c in cpp)
    assert [c.seq for c in cpp] == [1, 2, 3, 4] and all(c.seq_last == c.seq for c in cpp)
    assert [c.peer for c in cpp] == [None, 0, 0, None]  # the broadcasts' root, a global rank
    assert log.groups[cpp[0].gid].name == "0"
    gradients = cpp[-1]
    assert (gradients.shapes, gradients.dtypes, gradients.nbytes) == ([[10]], ["Float"], 40)  # 8 weights, 2 biases
    for c in cpp:  # enqueued, then completed on gloo's thread
        assert c.is_async and c.error is None and c.step == 0
        assert c.t_call_ns <= c.t_return_ns and c.t_done_ns is not None and c.t_done_ns >= c.t_call_ns
    assert lines["grad"] == [8.0, 8.0]  # the gradient all-reduce ran (one rank: the sum is its own)
    # The script's own all_reduce: the patch layer's record alone, the next sequence number.
    (python,) = [c for c in log.calls if not c.from_cpp]
    assert (python.op, python.seq, python.is_async) == ("all_reduce", 5, False)
    assert python.site.endswith(f"{this}:{lines['python']} _ddp_job")


def test_cpp_records_join_flight_recorder_by_sequence_number(tmp_path, forced):
    """Where Flight Recorder records gloo too (the switch forces the fallback on torch >= 2.8), each fallback
    record is the Flight Recorder entry of the same sequence number."""
    if OLD_TORCH:
        pytest.skip(f"torch {torch.__version__} has no Flight Recorder for gloo to compare with")
    log, _ = _record(tmp_path, _ddp_job)
    entries = {}
    for _t, name, _reason in log.fr_dumps:
        with open(tmp_path / "out" / name, "rb") as f:  # our own dump: a plain pickle.load is fine here
            entries.update({e["collective_seq_id"]: e for e in pickle.load(f)["entries"]})
    assert sum(c.from_cpp for c in log.calls) == 4, log.calls  # DDP's, as above: none would compare nothing
    for call in log.calls:
        entry = entries[call.seq]
        assert entry["profiling_name"] == f"gloo:{call.op}"
        assert entry["input_sizes"] == call.shapes


def test_by_default_the_fallback_is_installed_only_before_torch_2_8(tmp_path, fr_env, monkeypatch):
    monkeypatch.delenv(mechanisms.ENV_FALLBACK, raising=False)
    log, lines = _record(tmp_path, _ddp_job)
    assert lines["installed"] is OLD_TORCH
    cpp = [c.op for c in log.calls if c.from_cpp]
    assert cpp == (["all_gather", "broadcast", "broadcast", "all_reduce"] if OLD_TORCH else [])
    assert log.header["cpp_collectives"] == mechanisms.mechanisms(torch.__version__, {})


def test_a_fault_in_the_fallback_disables_recording_and_training_goes_on(tmp_path, forced, monkeypatch, capsys):
    monkeypatch.setenv(ENV_FAULT, "broadcast")  # raised at the first broadcast's signature: DDP's constructor's
    log, lines = _record(tmp_path, _ddp_job)
    assert lines["grad"] == [8.0, 8.0]  # the constructor finished, and backward all-reduced the gradients
    assert "recording disabled on rank 0 after an internal error: RuntimeError: injected recorder fault in " \
           "broadcast" in capsys.readouterr().err
    assert [c.op for c in log.calls] == ["all_gather"]  # nothing after the fault
    assert any("injected recorder fault" in message for _t, message in log.warnings)


def test_a_group_made_without_naming_a_backend_gets_sequence_numbers(tmp_path, fr_env):
    """Torch 2.4-2.6 give such a group backend ``undefined`` and a sequence counter that raises: its
    backend's counts instead, and the group's backends are logged (by device)."""
    def job() -> None:
        for _ in range(2):
            dist.all_reduce(torch.ones(2))

    log, _ = _record(tmp_path, job, backend=None)
    assert [c.seq for c in log.calls] == [1, 2]
    assert (log.groups[0].backend, log.groups[0].devices) == ("undefined", {"cpu": "gloo"})


class _Backend:
    def __init__(self, count: int) -> None:
        self.count = count

    def _get_sequence_number_for_group(self) -> int:
        return self.count


class _UndefinedGroup:
    """Torch 2.4-2.6's group of backend ``undefined``: its own counter raises, its backends count."""

    def __init__(self, devices: list[str]) -> None:
        self._device_types = [torch.device(d) for d in devices]

    def _get_sequence_number_for_group(self) -> int:
        raise RuntimeError("ProcessGroup undefined does not yet support sequence numbers.")

    def _get_backend(self, device: torch.device) -> _Backend:
        return _Backend({"cpu": 3, "cuda": 7}[device.type])


@pytest.mark.parametrize(("devices", "count"), [(["cpu"], 3), (["cpu", "cuda"], 7), ([], None)])
def test_the_backend_counter_behind_an_undefined_group(devices, count):
    """NCCL's where the group has it (Flight Recorder numbers NCCL's collectives by it), else gloo's."""
    counter = _backend_counter(_UndefinedGroup(devices))
    assert (counter() if counter is not None else None) == count
