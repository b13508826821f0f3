"""Recording inside the test process with ``comm2perfetto.enable()``/``disable()`` on a one-rank gloo group:
torch.cuda.nvtx mirroring (through a stand-in for its C library, which CPU builds lack), recording
started after ``init_process_group``, and ``comm2perfetto.step()``. Each test must leave nothing installed
(checked by the autouse fixture in conftest.py)."""

from __future__ import annotations

import inspect
import os
import signal

import orjson
import pytest
import torch
import torch.cuda.nvtx as torch_nvtx
import torch.distributed as dist

import comm2perfetto
from comm2perfetto.record import session
from comm2perfetto.sources.event_log import read_event_log
from support.torch_features import gloo_flight_recorder


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
                line = _here() + 1  # the next line: the call the log must point at
                dist.all_reduce(t)
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
    assert [reason for _t, _n, reason in log.fr_dumps] == (["disabled"] if gloo_flight_recorder() else [])


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
    from comm2perfetto.record.flight import TORCH_DEFAULT_RING, flight_recorder_off_by_default

    _init_one_rank()
    try:
        dist.all_reduce(torch.ones(3))  # before enable: not recorded
        out = comm2perfetto.enable(str(tmp_path / "out"), stall_after=None)
        try:
            from comm2perfetto.record import state

            # The ring torch made at init_process_group (its default: none on 2.8-2.10, which read the size at
            # the first group only): the dump schedule follows it, and a warning says so.
            ring = 0 if flight_recorder_off_by_default(torch.__version__) else TORCH_DEFAULT_RING
            assert state.recorder.flight._buffer_size == ring
            err = capsys.readouterr().err
            assert f"Flight Recorder's ring holds {ring} entries" in err
            assert ("Flight Recorder is off" in err) == (ring == 0)
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


def test_enable_refuses_an_unusable_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="exists and is not a folder; choose another output folder"):
        comm2perfetto.enable(str(tmp_path / "file"))


def test_threads_are_named_in_the_log(tmp_path, fr_env):
    import threading

    _init_one_rank()
    try:
        out = comm2perfetto.enable(str(tmp_path / "out"), stall_after=None)
        try:
            dist.all_reduce(torch.ones(4))
            worker = threading.Thread(target=lambda: dist.all_reduce(torch.ones(2)), name="loss-reducer")
            worker.start()
            worker.join()
        finally:
            comm2perfetto.disable()
    finally:
        dist.destroy_process_group()
    log = read_event_log(os.path.join(out, "rank0.events.jsonl"))
    by_op = {c.shapes[0][0]: c.tid for c in log.calls}
    assert log.thread_names[by_op[4]] == threading.main_thread().name
    assert log.thread_names[by_op[2]] == "loss-reducer"


def test_a_signal_the_process_ignores_stays_ignored_and_a_default_action_stays_the_default():
    """A shell's background job starts with SIGINT ignored: the recorder must not make it catch SIGINT (it
    would write an ending for a signal the job goes on ignoring). SIGTERM's default kills at once, also a rank
    blocked in C++ where no Python handler runs: the recorder leaves it alone. Only a Python handler the job
    has (Python's own for SIGINT, one the job installed) gets the recorder's in front of it."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    before_term = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        session._install_exit_handlers()
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        session.remove_exit_handlers()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
        session._install_exit_handlers()
        assert signal.getsignal(signal.SIGINT) is session._on_signal
        assert signal.getsignal(signal.SIGTERM) is session._on_signal
    finally:
        session.remove_exit_handlers()
        signal.signal(signal.SIGINT, before)
        signal.signal(signal.SIGTERM, before_term)


def test_recorder_ranges_go_to_a_domain_of_their_own(tmp_path, monkeypatch, fr_env):
    """With an NVTX collector attached (Nsight Systems), each recorded call is wrapped in a ``c10d:<op>`` range
    in the ``comm2perfetto`` domain, category ``collective``, so it can be filtered apart from the job's own
    ranges; the range is closed in that domain also when the call raises."""
    from comm2perfetto.record import nvtx as nvtx_ranges

    emitted: list[tuple] = []
    monkeypatch.setattr(nvtx_ranges, "collector_attached", lambda: True)
    monkeypatch.setattr(nvtx_ranges, "_nvtx_push", lambda name, **kw: emitted.append(("push", name, kw)))
    monkeypatch.setattr(nvtx_ranges, "_nvtx_pop", lambda **kw: emitted.append(("pop", kw)))
    comm2perfetto.enable(str(tmp_path / "out"), stall_after=None)
    try:
        _init_one_rank()
        try:
            dist.all_reduce(torch.ones(2))
            with pytest.raises(RuntimeError, match="root rank"):
                dist.broadcast(torch.ones(2), src=5)  # no rank 5 in a one-rank group: gloo refuses it
        finally:
            comm2perfetto.disable()
    finally:
        dist.destroy_process_group()
    own = {"domain": "comm2perfetto", "category": "collective"}
    assert emitted == [("push", "c10d:all_reduce", own), ("pop", {"domain": "comm2perfetto"}),
                       ("push", "c10d:broadcast", own), ("pop", {"domain": "comm2perfetto"})]


class _EnqueuedWork:
    """A work whose future is complete at once, as ProcessGroupNCCL's is right after the kernel is enqueued
    (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, WorkNCCL::getFuture; Work.get_future's docstring)."""

    def get_future(self):
        fut = torch.futures.Future()
        fut.set_result(None)
        return fut


@pytest.mark.parametrize("device, completion_logged", [("cpu", True), ("meta", False)])
def test_async_gpu_work_is_not_logged_done_at_enqueue(tmp_path, monkeypatch, fr_env, device, completion_logged):
    """An async call's `d` record comes from its future only for CPU work. For work on a device (meta stands
    in for CUDA here) the future completing says "enqueued": no `d`, the call is not left pending in the
    watchdog either, and its completion is Flight Recorder's to tell."""
    c10d = dist.distributed_c10d

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        return _EnqueuedWork() if async_op else None

    monkeypatch.setattr(c10d, "all_reduce", all_reduce)  # what the patch layer wraps on enable()
    out = comm2perfetto.enable(str(tmp_path / "out"), stall_after=None)
    try:
        _init_one_rank()
        try:
            from comm2perfetto.record import state

            rec = state.recorder
            c10d.all_reduce(torch.ones(2, device=device), async_op=True)
            pending = dict(rec.pending)
        finally:
            comm2perfetto.disable()
    finally:
        dist.destroy_process_group()
    (call,) = read_event_log(os.path.join(out, "rank0.events.jsonl")).calls
    assert call.is_async and call.t_return_ns is not None
    assert (call.t_done_ns is not None) == completion_logged
    assert pending == {}  # CPU: completed; device: never tracked as pending
    assert call.t_end_ns == (call.t_done_ns if completion_logged else None)


def test_a_group_whose_backend_depends_on_the_device_records_each_call_device(tmp_path, monkeypatch, fr_env):
    """On a group created as ``cpu:gloo,cuda:nccl`` the tensors' device decides which backend ran a call (and
    so whether its return was its completion): the recorder writes the device of every call there, bypassing
    the hot path's signature cache. (No NCCL in a CPU build: c10d's backend config is made to say so.)"""
    import torch.distributed.distributed_c10d as c10d

    out = comm2perfetto.enable(str(tmp_path / "out"), stall_after=None)
    try:
        _init_one_rank()
        try:
            monkeypatch.setattr(c10d, "get_backend_config", lambda group=None: "cpu:gloo,cuda:nccl")
            mixed = dist.new_group([0])
            for _ in range(3):
                dist.all_reduce(torch.ones(2), group=mixed)
            dist.all_reduce(torch.ones(2))  # the default group: one backend, the signature cache
            dist.all_reduce(torch.ones(2))
        finally:
            comm2perfetto.disable()
    finally:
        dist.destroy_process_group()
    log = read_event_log(os.path.join(out, "rank0.events.jsonl"))
    assert log.problems == []
    groups = {g.gid: g for g in log.groups.values()}
    mixed_gid = next(g.gid for g in groups.values() if g.devices == {"cpu": "gloo", "cuda": "nccl"})
    on_mixed = [c for c in log.calls if c.gid == mixed_gid]
    on_default = [c for c in log.calls if c.gid != mixed_gid]
    assert (len(on_mixed), len(on_default)) == (3, 2)
    assert [c.device for c in on_mixed] == ["cpu"] * 3 and [c.device for c in on_default] == [None] * 2
    assert all(groups[c.gid].completes_on_return(c) for c in log.calls)



def test_split_sizes_and_object_list_lengths_are_logged_as_given(tmp_path, fr_env):
    """What the `b` record's sizes field holds for each way a job passes them, on a one-rank group: split sizes
    as a list, a tuple or a torch.Size, not given or empty (torch's even split); the object lists' lengths. The
    calls themselves do what they do without recording."""
    import torch.distributed._functional_collectives as funcol

    from comm2perfetto.model import Exchange

    out = comm2perfetto.enable(str(tmp_path / "out"), stall_after=None)
    try:
        _init_one_rank()
        try:
            received = torch.zeros(3, 2)
            dist.all_to_all_single(received, torch.ones(3, 2), [3], [3])
            assert received.tolist() == [[1.0, 1.0]] * 3
            dist.all_to_all_single(torch.zeros(4), torch.ones(4), output_split_sizes=(4,),
                                   input_split_sizes=torch.Size([4]))
            dist.all_to_all_single(torch.zeros(5), torch.ones(5))
            dist.all_to_all_single(torch.zeros(5), torch.ones(5), [], [])
            dist.all_to_all([torch.zeros(2)], [torch.ones(2)])
            assert funcol.all_to_all_single(torch.ones(6), [6], [6], dist.group.WORLD).tolist() == [1.0] * 6
            assert funcol.all_to_all_single(torch.ones(2, 3), None, None, dist.group.WORLD).tolist() == [[1.0] * 3] * 2
            objects = ["a", 2, None]
            dist.broadcast_object_list(objects, src=0)
            assert objects == ["a", 2, None]
            gathered = [None]
            dist.all_gather_object(gathered, {"rank": 0})
            dist.gather_object("x", [None], dst=0)
            dist.scatter_object_list([None], ["y"], src=0)
        finally:
            dist.destroy_process_group()
    finally:
        comm2perfetto.disable()
    path = os.path.join(out, "rank0.events.jsonl")
    with open(path, "rb") as f:
        raw = [r for r in map(orjson.loads, f.read().rstrip(b"\0").splitlines()[1:]) if r[0] == "b"]
    assert [(r[3], r[13:]) for r in raw] == [
        ("all_to_all_single", [0, 0, [[3], [3], [3, 2]]]),
        ("all_to_all_single", [0, 0, [[4], [4], [4]]]),
        ("all_to_all_single", [0, 0, [None, None, [5]]]),
        ("all_to_all_single", [0, 0, [None, None, [5]]]),  # [] is what torch passes for "not given"
        ("all_to_all", [0, 0, [[[2]]]]),
        ("all_to_all_single", [1, 0, [[6], [6]]]),
        ("all_to_all_single", [1, 0, [None, None]]),
        ("broadcast_object_list", [0, 0, [3]]),
        ("all_gather_object", [0, 0, [1]]),
        ("gather_object", [0, 0, [1]]),
        ("scatter_object_list", [0, 0, [1]]),
    ]
    log = read_event_log(path)
    assert log.problems == []
    assert [c.exchange for c in log.calls[:7]] == [
        Exchange((6,), (6,)), Exchange((4,), (4,)), Exchange((5,), (5,), False, False),
        Exchange((5,), (5,), False, False), Exchange((2,), (2,)), Exchange((6,), (6,)),
        Exchange((6,), (6,), False, False)]
    assert [c.objects for c in log.calls[7:]] == [3, 1, 1, 1]
