"""The per-rank recorder: turns each patched call into log records, and owns the rank's output files.

The hot path (``recording_wrapper``, which bootstrap.py hands the patch layer to put in place of each torch
function) does as little as it can: read the clock, the group's sequence counter, the input tensors' shapes and
the caller's code location, and append one ``b`` record before and one ``e`` record after the call. Strings
that repeat (call sites, contexts, argument signatures) are written once and referred to by id.

Any exception inside the recorder goes to ``fault()``, which disables recording on this rank with one line
on stderr and one ``w`` record; the user's call always runs.
"""

from __future__ import annotations

import functools
import itertools
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import orjson

from comm2perfetto.record import capture, state
from comm2perfetto.record import nvtx as nvtx_ranges
from comm2perfetto.record.config import ENV_FAULT, RecordConfig
from comm2perfetto.record.context import ModuleTracker, StepCounter
from comm2perfetto.record.log import EventLog
from comm2perfetto.record.ops import P2P_KIND, SHAPE, SHAPES, SPLITS, p2p_keys

if TYPE_CHECKING:
    from comm2perfetto.record.flight import FlightRecorderDumps
    from comm2perfetto.record.ops import BoundSpec

_time_ns = time.time_ns
_threads = state.threads
_getframe = sys._getframe
_dumps = orjson.dumps
_NEWLINE = orjson.OPT_APPEND_NEWLINE

# Backends whose synchronous calls return once the work is done (the readers' sources.event_log.CPU_BACKENDS).
CPU_BACKENDS = frozenset({"gloo", "mpi", "ucc"})

# Steps after which module tracking switches itself off if it had nothing to attribute (check_module_tracking).
MODULES_GRACE_STEPS = 3

# Flight Recorder's dtype names (c10::ScalarType), so recorder and FR records compare directly.
_DTYPE_NAMES = {
    "float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
    "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool",
    "complex64": "ComplexFloat", "complex128": "ComplexDouble", "complex32": "ComplexHalf",
    "float8_e4m3fn": "Float8_e4m3fn", "float8_e5m2": "Float8_e5m2",
    "float8_e4m3fnuz": "Float8_e4m3fnuz", "float8_e5m2fnuz": "Float8_e5m2fnuz",
}


def recording_wrapper(call: BoundSpec, original: Callable[..., Any]) -> Callable[..., Any]:
    """The function that replaces ``original`` (see patch.py): the recorder's hot path.

    While this process records, a call is run between a ``b`` and an ``e`` record. This is the cost every
    recorded call pays, so it is one function (each Python call level costs a tenth of a microsecond) and the
    common case finds each thing it needs in one dict lookup: the call site by the caller's code position,
    the group by identity, the argument signature by (shape, dtype). First sightings, and calls made from
    inside torch (which walk out to the first frame outside it), go to the Recorder's methods.
    """

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # The slot is typed by what the other parts use of a recorder (view.RecorderView); only session.start
        # fills it, with a Recorder, whose own members the hot path reads. A local annotation costs nothing at
        # run time, where cast() would be a call.
        rec: Recorder | None = state.recorder  # type: ignore[assignment]
        if rec is None:
            return original(*args, **kwargs)
        thread = _threads.state
        if thread.call is not None:  # torch's implementation of a recorded call: covered by that record
            return original(*args, **kwargs)
        try:
            frame = _getframe(1)
            site = rec._sites.get((id(frame.f_code), frame.f_lasti))
            if site is None:
                site = rec._call_site(frame)
            t = _time_ns()
            n = len(args)
            group = args[call.group] if call.group < n else (kwargs.get("group") if kwargs else None)
            if group is None:
                info = rec._default_info or rec._group_info(None)
            else:
                info = rec._groups.get(id(group)) or rec._group_info(group)
            counter = info.seq_counter
            seq = raw_seq = None
            if counter is not None:
                raw_seq = counter()
                if call.collective:
                    seq = raw_seq + 1 - info.p2p_consumed
            async_op = call.always_async
            if call.async_op < n:
                async_op = bool(args[call.async_op])
            elif kwargs:
                async_op = bool(kwargs.get("async_op", async_op))
            aid = None
            if call.input_pos < n:  # the usual single input tensor, passed positionally
                value = args[call.input_pos]
                if value.__class__ is rec._tensor_type:  # an attribute read, cheaper than isinstance()
                    shapes = info.arg_ids.get(value.dtype)
                    if shapes is not None:
                        aid = shapes.get(value.shape)
            if aid is None:
                aid = rec._arguments(call, args, kwargs, info)
            backward = rec._graph_task_id() != -1
            ctx = rec._context(thread, backward) if thread.names or backward or thread.stack else 0
            cid = next(rec._cids)
            record = ["b", cid, t, call.name, info.gid, seq,
                      rec._peer(call, args, kwargs, info.group) if call.has_peer else None,
                      async_op, thread.tid, site, ctx, rec.steps.current, aid]
            if call.tail is not None:  # a functional collective, or one whose sizes are logged
                record += call.tail
                if call.extents:
                    record.append(rec._extents(call, args, kwargs))
            data = _dumps(record, _int_value, _NEWLINE)
            try:
                rec._append(data)
            except (ValueError, TypeError):  # the mapping is full (or closed)
                rec.log.write_bytes(data)
            if capture.active:  # captured into a CUDA graph: issued at each replay, not now
                rec._write(["v", cid])
            synced = rec._extras_before(call, args, kwargs) if rec._extras else None
        except Exception as exc:
            rec.fault(exc)
            return original(*args, **kwargs)

        # Guard every call: implementations nest in ways that change between releases (send goes through
        # isend on 2.13, object collectives through all_gather/broadcast, deprecated names through their
        # successors).
        thread.call = record
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            thread.call = None
            rec._raised(cid, exc)
            raise
        thread.call = None

        try:
            if not call.single and counter is not None:  # several collectives, or a p2p op
                raw_after = counter()
                if not call.collective:
                    info.p2p_consumed += raw_after - raw_seq
                seq = raw_after - info.p2p_consumed
            if not call.collective:
                p2p_at = rec._count_p2p(call, record, args, kwargs)
            if not async_op:
                info.returned = seq
            data = _dumps(["e", cid, _time_ns(), seq], None, _NEWLINE)
            try:
                rec._append(data)
            except (ValueError, TypeError):
                rec.log.write_bytes(data)
            if rec._extras:  # after `e`: with --sync the return is the enqueue, and `d` follows the synchronisation
                rec._extras_after(cid, synced)
            # Async work stays pending until its future completes. Work on a GPU gets no `d` record: its future
            # completes at enqueue (Work.get_future's docstring: "for GPU work, fut.done() returns true only
            # whether the operation has been enqueued"), so only Flight Recorder's state tells when it is done.
            # A functional collective returns an AsyncCollectiveTensor, no future: on CPU tensors, the wait on it
            # (which blocks until the work is done) says when.
            if result is not None:
                if call.functional:
                    rec._await_functional(cid, result)
                elif not rec._sync and rec._cpu_work(call, args, kwargs):
                    works = result if isinstance(result, list) else (result,)
                    futures = _futures_of(works)
                    if futures:
                        rec._on_completion(record, futures)
                    elif not call.collective:  # gloo's p2p work has no future: watched until it is done
                        rec._p2p_works[cid] = (record, works, p2p_at)
        except Exception as exc:
            rec.fault(exc)
        return result

    tracing = call.tracing
    if tracing is None:
        return wrapper
    recording = wrapper

    @functools.wraps(original)
    def functional_wrapper(*args: Any, **kwargs: Any) -> Any:
        if tracing():  # torch.compile or make_fx tracing DTensor code: fake tensors, no collective
            return original(*args, **kwargs)
        return recording(*args, **kwargs)

    return functional_wrapper


def wait_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    """The replacement of ``_functional_collectives.wait_tensor`` (what an AsyncCollectiveTensor calls when it
    is first used): the recorder learns when a functional collective on CPU tensors was done."""

    @functools.wraps(original)
    def wait_tensor(tensor: Any) -> Any:
        result = original(tensor)
        rec: Recorder | None = state.recorder  # type: ignore[assignment]
        if rec is not None and rec._awaited:
            try:
                rec.waited(tensor, _time_ns())
            except Exception as exc:
                rec.fault(exc)
        return result

    return wait_tensor


def dispatcher_kernel(call: BoundSpec, op: Any) -> Callable[..., Any]:
    """The kernel dispatch.py registers for one c10d op (``op``) where Flight Recorder does not record gloo:
    it records the collectives that reach the dispatcher without passing the patch layer, those issued from
    C++ (DDP's, FSDP's), with the patch layer's fields: a ``b`` record (``from_cpp`` set), an ``e`` record when
    the op has enqueued the work, a ``d`` record when the work's future completes. A collective the patch layer
    is recording on this thread (a Python call: ``dist.all_reduce`` reaches ``c10d::allreduce_``) passes
    through. The call site is the first frame outside torch (``loss.backward()``, ``DistributedDataParallel(...)``);
    the module is left out, as for every call the patch layer does not see."""
    from comm2perfetto.record.dispatch import redispatcher

    redispatch = redispatcher(op)
    import torch.distributed as dist

    unbox_group, unbox_work = dist.ProcessGroup.unbox, dist.Work.unbox

    def kernel(keyset: Any, *args: Any) -> Any:
        rec: Recorder | None = state.recorder  # type: ignore[assignment]  # as in recording_wrapper
        thread = _threads.state
        if rec is None or thread.call is not None:
            return redispatch(keyset, *args)
        try:
            group = unbox_group(args[call.group])  # the job's ProcessGroup object itself
            info = rec._groups.get(id(group)) or rec._group_info(group)
            t = _time_ns()
            counter = info.seq_counter
            seq = counter() + 1 - info.p2p_consumed if counter is not None else None
            frame = _getframe(0).f_back  # none on a thread without Python code (autograd's device threads)
            site = rec._call_site(frame) if frame is not None else None
            backward = rec._graph_task_id() != -1
            ctx = rec._cpp_context(thread, backward) if thread.names or backward else 0
            # One tensor (a DDP bucket): the patch layer's signature cache, by dtype and shape.
            value = args[call.input_pos] if call.input_pos < len(args) else None
            one = value[0] if value.__class__ is list and len(value) == 1 else None
            aid = None
            if one is not None:
                shapes = info.arg_ids.get(one.dtype)
                aid = shapes.get(one.shape) if shapes is not None else None
            if aid is None:
                aid = rec._arguments(call, args, {}, info)
                if one is not None and not info.mixed and one.__class__ is rec._tensor_type:
                    info.arg_ids.setdefault(one.dtype, {})[one.shape] = aid
            cid = next(rec._cids)
            record = ["b", cid, t, call.name, info.gid, seq,
                      rec._peer(call, args, {}, group) if call.has_peer else None,
                      True, thread.tid, site, ctx, rec.steps.current, aid, 0, 1]
            rec._write(record)
            synced = rec._extras_before(call, args, {}) if rec._extras else None
        except Exception as exc:
            rec.fault(exc)
            return redispatch(keyset, *args)
        thread.call = record
        try:
            result = redispatch(keyset, *args)
        except BaseException as exc:
            thread.call = None
            rec._raised(cid, exc)
            raise
        thread.call = None
        try:
            rec._write(["e", cid, _time_ns(), seq])
            if rec._extras:  # after `e`, as in the patch layer: `d` follows the synchronisation
                rec._extras_after(cid, synced)
            work = result[-1] if isinstance(result, tuple) else result
            futures = _futures_of((unbox_work(work),)) if work is not None else []
            if futures:
                rec._on_completion(record, futures)
        except Exception as exc:
            rec.fault(exc)
        return result

    return kernel


MAX_FAILED_REMEMBERED = 4096  # calls that raised, remembered for the watchdog (a job seldom survives many)


class _GroupInfo:
    """A process group seen by the patch layer.

    ``seq_counter`` is c10d's per-group counter. Flight Recorder's ``collective_seq_id`` is that counter on
    NCCL, but gloo also advances it for every point-to-point op, which Flight Recorder neither records nor
    numbers: ``p2p_consumed`` counts those, so recorded sequence numbers are always Flight Recorder's.
    """

    __slots__ = ("arg_ids", "backend", "cpu", "desc", "gid", "group", "mixed", "name", "p2p_consumed", "ranks",
                 "returned", "seq_counter")

    def __init__(self, gid: int, seq_counter: Any, group: Any, name: str = "", desc: str = "",
                 ranks: list[int] | None = None, backend: str = "", devices: dict[str, str] | None = None) -> None:
        self.gid = gid
        self.seq_counter = seq_counter
        self.group = group  # keeps the id() key valid for the group's lifetime
        self.p2p_consumed = 0
        self.name = name  # c10d's group name, Flight Recorder's process_group[0]
        self.desc = desc
        self.ranks = ranks or []
        self.backend = backend
        # Which backend runs a call is decided by its tensors' device (c10d's backend config: ``cpu:gloo``;
        # a group created with no backend says ``undefined`` and still runs gloo on CPU tensors).
        backends = set(devices.values()) if devices else {backend}
        self.cpu = bool(backends) and backends <= CPU_BACKENDS  # every call returns once its work is done
        # Several backends, by device (``cpu:gloo,cuda:nccl``): each call's device is written (`a` records
        # keyed by device), so these calls skip the hot path's signature cache, which does not read it.
        self.mixed = len(backends) > 1
        self.arg_ids: dict[Any, dict[Any, int]] = {}  # the hot path's signature cache (the recorder's, unless mixed)
        # The collective sequence number when the last synchronous call on this group returned (None: none
        # yet). On a CPU backend that call had completed.
        self.returned: int | None = None


class Recorder:
    """Recording state of one rank. Created when the default process group appears."""

    def __init__(self, config: RecordConfig, log: EventLog, rank: int, world_size: int) -> None:
        import torch
        import torch.distributed.distributed_c10d as c10d

        self.config = config
        self.log = log
        self.rank = rank
        self.world_size = world_size
        self._torch = torch
        self._tensor_type = torch.Tensor
        self._c10d = c10d
        self.arg_numel: dict[int, tuple[int, tuple[str, ...]]] = {}  # arg id -> (elements, dtypes)
        self.failed_calls: set[int] = set()  # cids of calls that raised: a stall they ended did not resolve
        self.uncaught = False  # an uncaught exception is ending the rank: a C++ collective's end then resolved nothing
        self._world = c10d.GroupMember
        self._declare_lock = threading.Lock()
        self._cids = itertools.count(1)
        # Code objects are keyed by id(): hashing one hashes its bytecode (half a microsecond for a training
        # loop). Each keyed code object is kept alive in _codes, so its id() is never reused.
        self._sites: dict[tuple[int, int], int] = {}  # (id(code), f_lasti) of a caller outside torch -> site
        self._site_ids = itertools.count(1)
        self._internal_code: dict[int, bool] = {}  # id(code) -> inside torch or comm2perfetto
        self._codes: list[Any] = []
        self._contexts: dict[tuple, int] = {}
        # Groups by id() of what the hot path is handed: a ProcessGroup, and for functional collectives a group
        # name or a DeviceMesh. Each key object is kept alive (by its _GroupInfo, or in ``_pinned``), so its
        # id() is never reused while it is a key. None, the default group, is ``_default_info``.
        self._groups: dict[int, _GroupInfo] = {}
        self._group_list: list[_GroupInfo] = []
        self._pinned: list[Any] = []
        self._keyed_groups: dict[tuple, _GroupInfo] = {}  # functional (mesh, dim) pairs and rank lists
        self._dtype_names: dict[Any, str] = {}
        # The hot path's argument signatures: dtype -> shape -> `a` id of one positional input tensor.
        self._arg_ids: dict[Any, dict[Any, int]] = {}
        # The others: a tuple of (shape, dtype), or None (object collectives) -> `a` id.
        self._other_arg_ids: dict[Any, int] = {}
        self._arg_id_count = itertools.count(1)
        self._emit_nvtx = nvtx_ranges.collector_attached()
        self._write = log.write
        self._append = log.append
        log.write(["c", 0, [], None, None])
        # Threads already known by then; later ones name themselves as they first touch state.threads.
        names = {t.ident: t.name for t in threading.enumerate()}
        for tid in list(state.all_threads.keys()):
            if tid in names:
                log.write(["n", tid, names[tid]])
        self._graph_task_id = getattr(torch._C, "_current_graph_task_id", _no_graph_task)
        self._default_group: Any = None
        self._default_info: _GroupInfo | None = None
        # Async calls whose work has not completed: cid -> the call's `b` record. A call still running is its
        # thread's ``ThreadState.call`` instead (in_flight()), so a synchronous call costs no bookkeeping.
        self.pending: dict[int, list] = {}
        # Outputs of functional collectives on CPU tensors not waited on yet: id(storage) -> (weak reference
        # to it, cid, [outputs of that call not waited on]).
        self._awaited: dict[int, tuple[Any, int, list[int]]] = {}
        # Async sends and receives whose work has no future (gloo's): cid -> (`b` record, works, each op's
        # index among its kind to its peer), until in_flight() finds the works completed.
        self._p2p_works: dict[int, tuple[list, Any, int | list[int]]] = {}
        self.p2p_counts: dict[tuple[int, str, int], int] = {}  # (gid, "send"/"recv", peer) -> ops issued
        self.steps = StepCounter(self)
        self.modules = ModuleTracker(self.fault) if config.modules else None
        self._attributed = False  # a recorded call ran inside a module or in backward
        self._sync = config.sync and torch.cuda.is_available()
        self._extras = self._sync or self._emit_nvtx
        self._internal_roots = _internal_roots(torch)
        self._fault_at = os.environ.get(ENV_FAULT)
        self.faulted = False
        self.flight: FlightRecorderDumps | None = None  # set by session
        self.clock: tuple[int, int] | None = None  # (offset_ns, rtt_ns) once clock.py measured it (session)
        self.cwd = os.getcwd()

    @property
    def default_group(self) -> Any:
        return self._default_group

    @default_group.setter
    def default_group(self, pg: Any) -> None:
        """Set by the session, and again when the job re-creates its default group."""
        self._default_group = pg
        self._default_info = None

    def release_groups(self) -> None:
        """Forget every process group (and Flight Recorder's counters, bound to them) once recording stopped.
        A group the job destroyed is then freed now, its threads joined by its destructor, rather than at
        interpreter shutdown: a gloo group still alive then can end the process with SIGABRT ("terminate
        called without an active exception")."""
        self._default_group = self._default_info = None
        self._groups.clear()
        self._group_list.clear()
        if self.flight is not None:
            self.flight.release_groups()

    def _extras_before(self, call: BoundSpec, args: tuple, kwargs: dict) -> Any:
        """Opt-in work around a call: NVTX emission when a collector is attached, and with --sync a
        synchronisation of the device the call's tensors are on (not the current device: a rank that passed
        ``device_id`` to init_process_group without set_device would open a context on GPU 0). CPU tensors
        (gloo: returning is completing) and calls during a CUDA graph capture (where a synchronisation is
        illegal) are not synchronised. Returns the device synchronised, for ``_extras_after``."""
        device = None
        if self._sync and not capture.active:
            tensor = _first_tensor(call, args, kwargs, self._tensor_type)
            if tensor is not None and tensor.device.type == "cuda":
                device = tensor.device
                self._torch.cuda.synchronize(device)
        if self._emit_nvtx:
            nvtx_ranges.emit_own_push(call.name)
        return device

    def _extras_after(self, cid: int, synced: Any) -> None:
        """After a synchronised call the work is done: a `d` record says when."""
        if synced is not None:
            self._torch.cuda.synchronize(synced)
            self._write(["d", cid, _time_ns()])
        if self._emit_nvtx:
            nvtx_ranges.emit_own_pop()

    def _on_completion(self, record: list, futures: list[Any]) -> None:
        cid = record[1]
        self.pending[cid] = record  # before the callbacks: a future done already runs its callback at once
        if len(futures) == 1:  # the usual case (and DDP's, through the dispatcher fallback): no counting
            futures[0].add_done_callback(functools.partial(self._completed, cid))
            return
        remaining = [len(futures)]
        lock = threading.Lock()

        def done(_future: Any) -> None:
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                self._completed(cid, _future)

        for future in futures:
            future.add_done_callback(done)

    def _completed(self, cid: int, _future: Any) -> None:
        """The work of call ``cid`` completed (a future's callback, on the thread that completed it)."""
        if state.recorder is self:
            try:
                self._write(["d", cid, _time_ns()])
                self.pending.pop(cid, None)
            except Exception as exc:
                self.fault(exc)

    def _await_functional(self, cid: int, result: Any) -> None:
        """Remember the storage of a functional collective's outputs on CPU tensors (each AsyncCollectiveTensor's
        ``elem``) until ``wait_tensor`` returns on a tensor using it: on the CPU that wait blocks until the work
        is done (funcol's docstring: "blocking on CPU and synchronizing streams on CUDA"), so its return is the
        call's `d` record, at the latest. The wait may come through another tensor on the same storage (DTensor
        hands on an alias), hence the storage. A storage nobody waits on is forgotten when freed (a weak
        reference: its Python object lives as long as the storage)."""
        outputs = result if isinstance(result, list) else (result,)
        elems: list[Any] = [getattr(r, "elem", None) for r in outputs]
        if not elems or not all(isinstance(e, self._tensor_type) and e.device.type == "cpu" for e in elems):
            return
        remaining = [len(elems)]
        awaited = self._awaited

        def forget(ref: Any, key: int) -> None:
            awaited.pop(key, None)

        for elem in elems:
            storage = elem.untyped_storage()
            key = id(storage)
            awaited[key] = (weakref.ref(storage, functools.partial(forget, key=key)), cid, remaining)

    def waited(self, tensor: Any, t_ns: int) -> None:
        """``wait_tensor(tensor)`` returned at ``t_ns``: the `d` record of the functional collective whose
        output's storage ``tensor`` uses, once all of that call's outputs were waited on."""
        storage = tensor.untyped_storage()
        entry = self._awaited.pop(id(storage), None)
        if entry is None or entry[0]() is not storage:
            return
        _ref, cid, remaining = entry
        remaining[0] -= 1
        if remaining[0] == 0:
            self._write(["d", cid, t_ns])

    def _count_p2p(self, call: BoundSpec, record: list, args: tuple, kwargs: dict) -> int | list[int]:
        """Count a point-to-point call's ops: per group, direction and peer, for the live verdict (the i-th send
        from A to B pairs with B's i-th recv from A); on a GPU also for the dump schedule, as each takes a Flight
        Recorder slot that no collective counter shows (gloo's send/recv are not in Flight Recorder at all).
        Returns each op's 1-based index among the rank's ops of its kind to its peer: one for a send or recv, a
        list for a batch (``p2p_keys`` order)."""
        peers = record[6]
        counts = self.p2p_counts
        at: int | list[int]
        if peers.__class__ is int:  # the usual single send or recv: no list built
            key = (record[4], P2P_KIND.get(record[3], "recv"), peers)
            at = counts[key] = counts.get(key, 0) + 1
        else:
            at = []
            for key in p2p_keys(record):
                n = counts[key] = counts.get(key, 0) + 1
                at.append(n)
        if self.flight is not None and not self._cpu_work(call, args, kwargs):
            self.flight.p2p_issued += len(peers) if isinstance(peers, list) else 1
        return at

    def _cpu_work(self, call: BoundSpec, args: tuple, kwargs: dict) -> bool:
        """Whether the call's work runs on the CPU (gloo), where a work's future completes with the work.
        Decided by its first tensor (a group can hold a CPU and a GPU backend); no tensor: CPU."""
        tensor = _first_tensor(call, args, kwargs, self._tensor_type)
        return tensor is None or tensor.device.type == "cpu"

    def _raised(self, cid: int, exc: BaseException) -> None:
        try:
            if self._emit_nvtx:
                nvtx_ranges.emit_own_pop()
            self._write(["x", cid, _time_ns(), f"{type(exc).__name__}: {exc}"[:500]])
            self.pending.pop(cid, None)
            if len(self.failed_calls) < MAX_FAILED_REMEMBERED:
                self.failed_calls.add(cid)
        except Exception as inner:
            self.fault(inner)

    # --- what a call record refers to: first sight of each (the hot path's cache misses) ------------------------

    def _arguments(self, call: BoundSpec, args: tuple, kwargs: dict, info: _GroupInfo) -> int:
        """Interned id of the input tensors' (shapes, dtypes, bytes[, device]): written once per distinct
        signature. The device (of the first tensor) is part of it on a group whose backend depends on the
        device, the one place where it decides which backend ran the call."""
        if self._fault_at == call.name:  # first sight of a signature: where the tests inject a fault
            raise RuntimeError(f"injected recorder fault in {call.name} (COMM2PERFETTO_TEST_FAULT)")
        n = len(args)
        tensor_type = self._tensor_type
        tensors = list(_input_tensors(call, args, kwargs, tensor_type))
        pairs = [(t.shape, t.dtype) for t in tensors]
        device = tensors[0].device.type if info.mixed and tensors else None
        # Object collectives (no input tensors) have no signature and no bytes.
        key = (tuple(pairs), device) if call.inputs else None
        aid = self._other_arg_ids.get(key)
        if aid is None:
            aid = self._other_arg_ids[key] = next(self._arg_id_count)
            shapes = [list(shape) for shape, _ in pairs]
            dtypes = [self._dtype_name(dtype) for _, dtype in pairs]
            nbytes = sum(_numel(shape) * dtype.itemsize for shape, dtype in pairs) if call.inputs else None
            self._write(["a", aid, shapes, dtypes, nbytes] + ([device] if device is not None else []))
            if call.inputs:  # what a pending call passes, for the live verdict (its summary at a stall)
                self.arg_numel[aid] = (sum(_numel(shape) for shape, _ in pairs), tuple(dtypes))
        if not info.mixed and call.input_pos < n and args[call.input_pos].__class__ is tensor_type:
            info.arg_ids.setdefault(pairs[0][1], {})[pairs[0][0]] = aid  # the hot path's key too
        return aid

    def _extents(self, call: BoundSpec, args: tuple, kwargs: dict) -> list:
        """The `b` record's ``sizes``: what the call's ``extents`` parameters hold (ops.py), each null when None.
        Only list lengths for object lists: pickling the objects to learn their size would be a second pickle
        the job does not do (torch pickles them inside the call, and its Flight Recorder entries of the size
        and payload collectives carry both). A split list torch's C++ side takes as empty is the even split."""
        n = len(args)
        out: list = []
        for pos, name, kind in call.extents:
            value = args[pos] if pos < n else kwargs.get(name)
            if value is None:
                out.append(None)
            elif kind is SPLITS:  # the list itself, serialised before the call: its ints, or _int_value's
                out.append((value if value.__class__ is list else list(value)) or None)
            elif kind is SHAPE:
                out.append(list(value.shape))
            elif kind is SHAPES:
                out.append([list(t.shape) for t in value])
            else:
                out.append(len(value))
        return out

    def _peer(self, call: BoundSpec, args: tuple, kwargs: dict, group: Any) -> Any:
        n = len(args)
        if call.p2p_ops:  # batch_isend_irecv: a list of P2POp, each with its own peer
            pos, name = call.inputs[0]
            ops = args[pos] if pos < n else kwargs.get(name) or ()
            return [[getattr(op.op, "__name__", str(op.op)), op.peer] for op in ops]
        for pos, name, is_group_rank in call.peers:
            value = args[pos] if pos < n else kwargs.get(name)
            if value is not None:
                return self._c10d.get_global_rank(group, value) if is_group_rank else value
        return None

    def _dtype_name(self, dtype: Any) -> str:
        name = self._dtype_names.get(dtype)
        if name is None:
            short = str(dtype).removeprefix("torch.")
            name = self._dtype_names[dtype] = _DTYPE_NAMES.get(short, short)
        return name

    def _group_info(self, group: Any) -> _GroupInfo:
        """The group a call names: None (the default group), a ProcessGroup, or what a functional collective
        accepts (a group name, a DeviceMesh, a ``(mesh, dim)`` pair, a list of ranks). Remembered by id() where
        the hot path can find it again; a pair or a list is a new object at every call, so it is looked up by
        value here instead."""
        if group is None:
            info = self._default_info = self.declare_group(self._default_group)
            return info
        if isinstance(group, self._c10d.ProcessGroup):
            return self.declare_group(group)
        if isinstance(group, (tuple, list)):
            key = (id(group[0]), group[1]) if isinstance(group, tuple) else tuple(group)
            keyed = self._keyed_groups.get(key)
            if keyed is None:
                keyed = self._keyed_groups[key] = self.declare_group(_resolve_functional_group(self._c10d, group))
                if isinstance(group, tuple):
                    self._pinned.append(group[0])  # the mesh, whose id() is in the key
            return keyed
        info = self._groups[id(group)] = self.declare_group(_resolve_functional_group(self._c10d, group))
        self._pinned.append(group)
        return info

    def declare_group(self, group: Any) -> _GroupInfo:
        """The group's info, declaring it in the log (a ``g`` record) the first time. The watchdog thread
        declares too (``declare_all_groups``): the first declaration takes a lock, the hot path never does."""
        info = self._groups.get(id(group))
        if info is not None:
            return info
        with self._declare_lock:
            info = self._groups.get(id(group))
            return info if info is not None else self._declare(group)

    def declare_all_groups(self) -> None:
        """Declare every process group this process has created, used or not (at a stall, from the watchdog):
        a group the rank never used is known to it all the same, under the c10d name its creation order gave
        it, which is how ranks that created their groups in different orders are told apart. Reads c10d's
        registry only."""
        try:
            created = list(getattr(getattr(self._c10d, "_world", None), "pg_names", None) or ())
        except Exception:  # the registry changing under us (a group being destroyed): try at the next stall
            return
        for group in created:
            try:
                self.declare_group(group)
            except Exception:
                continue

    def _declare(self, group: Any) -> _GroupInfo:
        c10d = self._c10d
        gid = len(self._group_list)
        try:
            name = c10d._get_process_group_name(group)
        except Exception:
            name = getattr(group, "group_name", str(gid))
        desc = getattr(group, "group_desc", "") or ""
        try:
            ranks = c10d.get_process_group_ranks(group)
        except Exception:
            ranks = []
        if not ranks and group is self._world.WORLD:
            ranks = list(range(self.world_size))  # declared while init_process_group is still running
        try:
            backend = str(c10d.get_backend(group))
        except Exception:
            backend = ""
        devices = _device_backends(c10d, group)
        counter = getattr(group, "_get_sequence_number_for_group", None)
        if counter is not None:
            try:
                counter()
            except Exception:  # torch 2.4-2.6's "undefined" backend, or a backend without a sequence counter
                counter = _backend_counter(group)
        info = _GroupInfo(gid, counter, group, str(name), desc, list(ranks), backend, devices)
        if not info.mixed:
            info.arg_ids = self._arg_ids  # one cache for every group: a signature is the same on any of them
        self._groups[id(group)] = info
        self._group_list.append(info)
        self._write(["g", gid, name, desc, ranks, backend, devices])
        return info

    @property
    def internal_roots(self) -> tuple[str, ...]:
        """Path prefixes of frames that are not user code: torch, comm2perfetto, decorator layers."""
        return self._internal_roots

    def groups(self) -> list[_GroupInfo]:
        """The groups declared so far, in declaration order (``g`` records)."""
        return list(self._group_list)

    def completed_on_cpu(self, group_name: str, seq: int) -> bool:
        """Whether the patch layer saw collective ``seq`` of this group complete: a synchronous call on a group
        whose every backend runs on the CPU (gloo, also as ``undefined`` or ``cpu:gloo``) returned at or after
        it. Gloo's Flight Recorder status can lag behind that (seen on 2.13: a rank idle after a collective
        still showed it unfinished seconds later), and this evidence wins."""
        for info in self._group_list:
            if info.name == group_name and info.cpu:
                return info.returned is not None and seq <= info.returned
        return False

    def group_name(self, gid: int) -> str:
        return self._group_list[gid].name if 0 <= gid < len(self._group_list) else str(gid)

    def _call_site(self, frame: Any) -> int | None:
        """Interned ``file:line function`` of the first frame outside torch and comm2perfetto, from the
        wrapper's caller ``frame`` outwards. Only positions outside torch are keys, so the hot path finds a
        direct caller's site at once; a call from inside torch (DTensor's, FSDP's) walks out each time."""
        internal = self._internal_code
        while frame is not None:
            code = frame.f_code
            is_internal = internal.get(id(code))
            if is_internal is None:
                is_internal = internal[id(code)] = code.co_filename.startswith(self._internal_roots)
                self._codes.append(code)
            if not is_internal:
                break
            frame = frame.f_back
        if frame is None:
            return None
        key = (id(code), frame.f_lasti)  # the call instruction: cheaper to read than f_lineno, as unique
        sid = self._sites.get(key)
        if sid is None:
            filename = code.co_filename
            if filename.startswith(self.cwd + os.sep):
                filename = filename[len(self.cwd) + 1:]
            sid = self._sites[key] = next(self._site_ids)
            self._write(["s", sid, f"{filename}:{frame.f_lineno} {code.co_name}"])
        return sid

    def _context(self, thread: state.ThreadState, backward: bool) -> int:
        """Interned (open NVTX ranges, module path, pass) of the calling thread; 0 is the empty context."""
        names = thread.names
        module = thread.stack[-1][1] if thread.stack else None
        tracker = self.modules  # read once: check_module_tracking may switch it off meanwhile
        if module is None and backward and tracker is not None:  # backward proper, not a recomputation
            module = tracker.backward_path()
        pass_ = "backward" if backward else ("forward" if module is not None else None)
        if pass_ is not None:
            self._attributed = True
        key = (names, module, pass_)
        ctx = self._contexts.get(key)
        if ctx is None:
            ctx = self._contexts[key] = len(self._contexts) + 1
            self._write(["c", ctx, list(names), module, pass_])
        return ctx

    def _cpp_context(self, thread: state.ThreadState, backward: bool) -> int:
        """The context of a collective only the dispatcher fallback sees: the open ranges and the pass, and no
        module (a C++ caller's collective, such as DDP's bucket of many modules' gradients, is no module's).
        Unlike ``_context`` it never keeps module tracking on."""
        key = (thread.names, None, "backward" if backward else None)
        ctx = self._contexts.get(key)
        if ctx is None:
            ctx = self._contexts[key] = len(self._contexts) + 1
            self._write(["c", ctx, list(key[0]), None, key[2]])
        return ctx

    def in_flight(self) -> list[list]:
        """The `b` records (cid, t, op, gid, seq ...) of the calls not completed, oldest first: calls running
        on some thread and async calls whose work is pending."""
        records = dict(self.pending)
        for cid, (watched, works, _) in list(self._p2p_works.items()):
            if _works_done(works):
                self._p2p_works.pop(cid, None)
            else:
                records[cid] = watched
        for ref in state.all_threads.valuerefs():
            thread = ref()
            record = thread.call if thread is not None else None
            if record is not None:
                records[record[1]] = record
        return [records[cid] for cid in sorted(records)]

    def p2p_works_pending(self) -> dict[int, list[int]]:
        """Sends and receives that returned and whose work is not done (see ``in_flight``): cid -> each op's
        index among this rank's ops of its kind to its peer (1-based, in ``p2p_keys`` order)."""
        return {cid: at if isinstance(at, list) else [at] for cid, (_, _, at) in list(self._p2p_works.items())}

    def check_module_tracking(self, step: int) -> None:
        """At a step boundary: switch module tracking off once ``MODULES_GRACE_STEPS`` steps went by without a
        recorded call it could attribute (none inside a module, none in backward): DDP's and FSDP1's
        collectives are issued from C++, and then the hooks would cost every module call for nothing."""
        if step < MODULES_GRACE_STEPS:
            return
        self.steps.listeners.remove(self.check_module_tracking)  # decided for good: no check at later steps
        if self.modules is None or self._attributed:
            return
        self.modules.uninstall()
        self.modules = None
        self.warn(f"module tracking switched off after {step} steps: no recorded call ran inside a module or "
                  f"in backward; later calls have no module")

    # --- lifecycle ------------------------------------------------------------------------------------------

    def name_thread(self, tid: int) -> None:
        """The first time a thread is seen: its name, for the trace's thread tracks."""
        try:
            self._write(["n", tid, threading.current_thread().name])
        except Exception as exc:
            self.fault(exc)

    def warn(self, message: str) -> None:
        self._write(["w", _time_ns(), message])

    def fault(self, exc: BaseException) -> None:
        """Disable recording on this rank after an internal error; training goes on."""
        if self.faulted:
            return
        self.faulted = True
        if state.recorder is self:
            state.recorder = None
        message = f"comm2perfetto: recording disabled on rank {self.rank} after an internal error: " \
                  f"{type(exc).__name__}: {exc}"
        # One write: ranks share the launcher's stderr, unbuffered under torchrun, and print() writes the
        # newline separately, so lines of two ranks would run together.
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        try:
            self.warn(message)
        except Exception:
            pass

    def dump_flight_recorder(self, reason: str, wait: bool = True) -> None:
        if self.flight is not None:
            self.flight.dump(reason, wait)


def _int_value(value: Any) -> int:
    """A value in a `b` record that orjson does not serialise itself: an int-like split size (a numpy integer, a
    0-d tensor), as int. Anything else raises, as orjson would, and disables recording on the rank."""
    return int(value)


def _no_graph_task() -> int:
    return -1


def _backend_counter(group: Any) -> Callable[[], int] | None:
    """The sequence counter of the backend behind a group whose own counter raises. Torch 2.4 to 2.6 make a
    group created without naming a backend (``init_process_group()``, ``init_device_mesh("cpu", ...)``) of
    backend ``undefined``, whose ``_get_sequence_number_for_group()`` raises "does not yet support sequence
    numbers"; its backend counts, as the group's own counter does on 2.7 and later. The CUDA backend's where
    the group has one (Flight Recorder numbers NCCL's collectives by it), else the CPU backend's (gloo)."""
    import torch

    types = {getattr(device, "type", None) for device in getattr(group, "_device_types", ())}
    for device in ("cuda", "cpu"):
        if device not in types:
            continue
        try:
            counter = group._get_backend(torch.device(device))._get_sequence_number_for_group
            counter()
            return counter
        except Exception:
            continue
    return None


def _resolve_functional_group(c10d: Any, group: Any) -> Any:
    """The ProcessGroup behind a functional collective's ``group`` argument, resolved as funcol does."""
    import warnings

    from torch.distributed import _functional_collectives as funcol

    with warnings.catch_warnings():  # a rank list is deprecated: the user's own call warns already
        warnings.simplefilter("ignore")
        name = funcol._resolve_group_name(group)
    return c10d._resolve_process_group(name)


def _device_backends(c10d: Any, group: Any) -> dict[str, str] | None:
    """The backend that runs the group's calls on each device type, from c10d's backend config
    (``"cpu:gloo,cuda:nccl"`` -> ``{"cpu": "gloo", "cuda": "nccl"}``); None where torch does not say."""
    try:
        config = str(c10d.get_backend_config(group))
    except Exception:
        return None
    pairs = [item.split(":", 1) for item in config.split(",") if ":" in item]
    return {device.strip(): backend.strip() for device, backend in pairs} or None


def _numel(shape: Any) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total


def _input_tensors(call: BoundSpec, args: tuple, kwargs: dict, tensor_type: type) -> Iterator[Any]:
    """A call's input tensors, in order: a tensor argument, or those of a list of tensors, of P2POp
    (batch_isend_irecv) or of lists of tensors (a c10d op's ``Tensor[][]``)."""
    n = len(args)
    for pos, name in call.inputs:
        value = args[pos] if pos < n else kwargs.get(name)
        if value is None:
            continue
        if isinstance(value, tensor_type):
            yield value
            continue
        for item in value:
            if isinstance(item, list):  # a c10d op's Tensor[][] (dispatcher_kernel): scatter_'s inputs
                yield from (t for t in item if isinstance(t, tensor_type))
                continue
            item = item if isinstance(item, tensor_type) else getattr(item, "tensor", None)
            if isinstance(item, tensor_type):
                yield item


def _first_tensor(call: BoundSpec, args: tuple, kwargs: dict, tensor_type: type) -> Any:
    """The first input tensor of a call, or None."""
    return next(_input_tensors(call, args, kwargs, tensor_type), None)


def _futures_of(works: Any) -> list[Any]:
    futures = []
    for work in works:
        try:
            futures.append(work.get_future())
        except (AttributeError, RuntimeError):  # "Work::getFuture not implemented"
            return []
    return futures


def _works_done(works: Any) -> bool:
    for work in works:
        try:
            if not work.is_completed():
                return False
        except (AttributeError, RuntimeError):  # not a Work, or its group is gone: nothing to wait for
            continue
    return True


def _internal_roots(torch: Any) -> tuple[str, ...]:
    """Where frames are not a call site: torch, the recorder, and the decorator layers torch's functions are
    wrapped in (functools, contextlib, typing_extensions' and warnings' ``deprecated``). The package's
    ``examples`` are user code, so the recorder's root is ``comm2perfetto/record/``, not the whole package."""
    import contextlib
    import warnings

    record = os.path.dirname(__file__)  # as frames name their files (co_filename), not made absolute
    package_init = os.path.join(os.path.dirname(record), "__init__.py")
    roots = [os.path.dirname(torch.__file__) + os.sep, record + os.sep, package_init,
             functools.__file__, contextlib.__file__, warnings.__file__]
    extensions = sys.modules.get("typing_extensions")
    if extensions is not None and extensions.__file__:
        roots.append(extensions.__file__)
    return tuple(roots)
