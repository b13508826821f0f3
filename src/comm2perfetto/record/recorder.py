"""The per-rank recorder: turns each patched call into log records, and owns the rank's output files.

The hot path (``record_call``) does as little as it can: read the clock, the group's sequence counter, the
input tensors' shapes and the caller's code location, and append one ``b`` record before and one ``e`` record
after the call. Strings that repeat (call sites, contexts) are written once and referred to by id.

Any exception inside the recorder goes to ``fault()``, which disables recording on this rank with one line
on stderr and one ``w`` record; the user's call always runs.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from typing import Any

from comm2perfetto.record import nvtx as nvtx_ranges
from comm2perfetto.record import state
from comm2perfetto.record.config import ENV_FAULT, RecordConfig
from comm2perfetto.record.context import ModuleTracker, StepCounter
from comm2perfetto.record.log import EventLog
from comm2perfetto.record.patch import BoundSpec, busy

_time_ns = time.time_ns
_get_ident = threading.get_ident

# Flight Recorder's dtype names (c10::ScalarType), so recorder and FR records compare directly.
_DTYPE_NAMES = {
    "float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
    "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool",
    "complex64": "ComplexFloat", "complex128": "ComplexDouble", "complex32": "ComplexHalf",
    "float8_e4m3fn": "Float8_e4m3fn", "float8_e5m2": "Float8_e5m2",
    "float8_e4m3fnuz": "Float8_e4m3fnuz", "float8_e5m2fnuz": "Float8_e5m2fnuz",
}


class _GroupInfo:
    """A process group seen by the patch layer.

    ``seq_counter`` is c10d's per-group counter. Flight Recorder's ``collective_seq_id`` is that counter on
    NCCL, but gloo also advances it for every point-to-point op, which Flight Recorder neither records nor
    numbers: ``p2p_consumed`` counts those, so recorded sequence numbers are always Flight Recorder's.
    """

    __slots__ = ("gid", "seq_counter", "group", "p2p_consumed")

    def __init__(self, gid: int, seq_counter: Any, group: Any) -> None:
        self.gid = gid
        self.seq_counter = seq_counter
        self.group = group  # keeps the id() key valid for the group's lifetime
        self.p2p_consumed = 0


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
        self._world = c10d.GroupMember
        self._cids = itertools.count(1)
        self._strings: dict[Any, int] = {}
        self._contexts: dict[tuple, int] = {}
        self._groups: dict[int, _GroupInfo] = {}
        self._internal_code: dict[Any, bool] = {}
        self._dtype_names: dict[Any, str] = {}
        self._arg_ids: dict[tuple, int] = {}
        self._emit_nvtx = nvtx_ranges.collector_attached()
        self._write = log.write
        log.write(["c", 0, [], None, None])
        self._graph_task_id = getattr(torch._C, "_current_graph_task_id", None)
        self.default_group: Any = None  # set by the session; re-set if the job re-creates it
        self.pending: dict[int, tuple[int, str, int, int | None]] = {}
        self.steps = StepCounter(self)
        self.modules = ModuleTracker() if config.modules else None
        self._module_stack = self.modules.stack if self.modules is not None else None
        self._sync = config.sync and torch.cuda.is_available()
        self._extras = self._sync or self._emit_nvtx
        self._internal_roots = _internal_roots(torch)
        self._fault_at = os.environ.get(ENV_FAULT)
        self.faulted = False
        self.flight = None  # set by session: record.flight.FlightRecorderDumps
        self.cwd = os.getcwd()

    # --- the hot path ---------------------------------------------------------------------------------------

    def record_call(self, call: BoundSpec, original: Any, args: tuple, kwargs: dict) -> Any:
        """Run ``original`` between a ``b`` and an ``e`` record. One function on purpose: this is the cost
        every recorded call pays, and each Python call level costs a tenth of a microsecond."""
        pending = self.pending
        try:
            t = _time_ns()
            n = len(args)
            group = args[call.group] if call.group < n else kwargs.get("group")
            if group is None:
                group = self.default_group
            info = self._groups.get(id(group)) or self._declare_group(group)
            counter = info.seq_counter
            seq = raw_seq = None
            if counter is not None:
                raw_seq = counter()
                if call.collective:
                    seq = raw_seq + 1 - info.p2p_consumed
            if call.async_op < n:
                async_op = bool(args[call.async_op])
            else:
                async_op = call.always_async or bool(kwargs.get("async_op", False))
            graph_task = self._graph_task_id
            backward = graph_task is not None and graph_task() != -1
            modules = self._module_stack.modules if self._module_stack is not None else None
            names = nvtx_ranges.open_ranges.names
            cid = next(self._cids)
            if self._fault_at == call.name:
                raise RuntimeError(f"injected recorder fault in {call.name} (COMM2PERFETTO_TEST_FAULT)")
            self._write([
                "b", cid, t, call.name, info.gid, seq,
                self._peer(call, args, kwargs, group) if call.has_peer else None,
                async_op, _get_ident(), self._call_site(),
                self._context(names, backward) if (names or modules or backward) else 0,
                self.steps.current, self._arguments(call, args, kwargs),
            ])
            pending[cid] = (t, call.name, info.gid, seq)
            if self._extras:
                self._extras_before(call)
        except Exception as exc:
            self.fault(exc)
            return original(*args, **kwargs)

        # Guard every call: implementations nest in ways that change between releases (send goes through
        # isend on 2.13, object collectives through all_gather/broadcast).
        busy.active = True
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            busy.active = False
            self._raised(cid, exc)
            raise
        busy.active = False

        try:
            if self._extras:
                self._extras_after()
            if not call.single and counter is not None:  # several collectives, or a p2p op
                raw_after = counter()
                if not call.collective:
                    info.p2p_consumed += raw_after - raw_seq
                seq = raw_after - info.p2p_consumed
            self._write(["e", cid, _time_ns(), seq])
            if result is None or self._sync:
                del pending[cid]
            else:
                futures = _futures_of(result if isinstance(result, list) else (result,))
                if futures:
                    self._on_completion(cid, futures)
                else:  # completion cannot be observed (gloo p2p work has no future)
                    del pending[cid]
        except Exception as exc:
            self.fault(exc)
        return result

    def _extras_before(self, call: BoundSpec) -> None:
        """Opt-in work around a call: device sync (--sync), NVTX emission when a collector is attached."""
        if self._sync:
            self._torch.cuda.synchronize()
        if self._emit_nvtx:
            nvtx_ranges.emit_push("c10d:" + call.name)

    def _extras_after(self) -> None:
        if self._sync:
            self._torch.cuda.synchronize()
        if self._emit_nvtx:
            nvtx_ranges.emit_pop()

    def _on_completion(self, cid: int, futures: list[Any]) -> None:
        remaining = [len(futures)]
        lock = threading.Lock()

        def done(_future: Any) -> None:
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last and state.recorder is self:
                try:
                    self._write(["d", cid, _time_ns()])
                    self.pending.pop(cid, None)
                except Exception as exc:
                    self.fault(exc)

        for future in futures:
            future.add_done_callback(done)

    def _raised(self, cid: int, exc: BaseException) -> None:
        try:
            if self._emit_nvtx:
                nvtx_ranges.emit_pop()
            self._write(["x", cid, _time_ns(), f"{type(exc).__name__}: {exc}"[:500]])
            self.pending.pop(cid, None)
        except Exception as inner:
            self.fault(inner)

    # --- what a call record refers to -----------------------------------------------------------------------

    def _arguments(self, call: BoundSpec, args: tuple, kwargs: dict) -> int:
        """Interned id of the input tensors' (shapes, dtypes, bytes): written once per distinct signature."""
        n = len(args)
        tensor_type = self._tensor_type
        if len(call.inputs) == 1:  # fast path: one input tensor (all_reduce, broadcast, send ...)
            pos, name = call.inputs[0]
            value = args[pos] if pos < n else kwargs.get(name)
            if isinstance(value, tensor_type):
                aid = self._arg_ids.get((call.name, value.shape, value.dtype))
                if aid is not None:
                    return aid
        key: list = [call.name]
        for pos, name in call.inputs:
            value = args[pos] if pos < n else kwargs.get(name)
            if value is None:
                continue
            if isinstance(value, tensor_type):
                key.append((value.shape, value.dtype))
                continue
            for item in value:  # a list of tensors, or of P2POp (batch_isend_irecv)
                if not isinstance(item, tensor_type):
                    item = getattr(item, "tensor", None)
                    if item is None:
                        continue
                key.append((item.shape, item.dtype))
        frozen = tuple(key)
        aid = self._arg_ids.get(frozen)
        if aid is None:
            aid = self._arg_ids[frozen] = len(self._arg_ids) + 1
            if len(key) == 2:  # also under the fast path's key
                self._arg_ids[(call.name, *key[1])] = aid
            shapes = [list(shape) for shape, _ in key[1:]]
            dtypes = [self._dtype_name(dtype) for _, dtype in key[1:]]
            nbytes = sum(_numel(shape) * dtype.itemsize for shape, dtype in key[1:]) if call.inputs else None
            self._write(["a", aid, shapes, dtypes, nbytes])
        return aid

    def _peer(self, call: BoundSpec, args: tuple, kwargs: dict, group: Any) -> Any:
        if call.name == "batch_isend_irecv":
            ops = args[0] if args else kwargs.get("p2p_op_list") or ()
            return [[getattr(op.op, "__name__", str(op.op)), op.peer] for op in ops]
        n = len(args)
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

    def _declare_group(self, group: Any) -> _GroupInfo:
        c10d = self._c10d
        gid = len(self._groups)
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
        counter = getattr(group, "_get_sequence_number_for_group", None)
        if counter is not None:
            try:
                counter()
            except Exception:  # backends without a sequence counter
                counter = None
        info = _GroupInfo(gid, counter, group)
        self._groups[id(group)] = info
        self._write(["g", gid, name, desc, ranks, backend])
        return info

    def _intern(self, key: Any, text: str) -> int:
        sid = len(self._strings) + 1
        self._strings[key] = sid
        self._write(["s", sid, text])
        return sid

    def _call_site(self) -> int | None:
        """Interned ``file:line function`` of the first caller frame outside torch and comm2perfetto."""
        try:
            frame = sys._getframe(3)  # _call_site < record_call < wrapper < caller
        except ValueError:
            return None
        internal = self._internal_code
        while frame is not None:
            code = frame.f_code
            is_internal = internal.get(code)
            if is_internal is None:
                is_internal = internal[code] = code.co_filename.startswith(self._internal_roots)
            if not is_internal:
                break
            frame = frame.f_back
        if frame is None:
            return None
        key = (code, frame.f_lasti)  # the call instruction: cheaper to read than f_lineno, as unique
        sid = self._strings.get(key)
        if sid is None:
            filename = code.co_filename
            if filename.startswith(self.cwd + os.sep):
                filename = filename[len(self.cwd) + 1:]
            sid = self._intern(key, f"{filename}:{frame.f_lineno} {code.co_name}")
        return sid

    def _context(self, names: tuple[str, ...], backward: bool) -> int:
        """Interned (open NVTX ranges, module path, pass) of the calling thread; 0 is the empty context."""
        module = self.modules.current_path() if self.modules is not None else None
        pass_ = "backward" if backward else ("forward" if module is not None else None)
        key = (names, module, pass_)
        ctx = self._contexts.get(key)
        if ctx is None:
            ctx = self._contexts[key] = len(self._contexts) + 1
            self._write(["c", ctx, list(names), module, pass_])
        return ctx

    # --- lifecycle ------------------------------------------------------------------------------------------

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


def _numel(shape: Any) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total


def _futures_of(works: Any) -> list[Any]:
    futures = []
    for work in works:
        try:
            futures.append(work.get_future())
        except (AttributeError, RuntimeError):  # "Work::getFuture not implemented"
            return []
    return futures


def _internal_roots(torch: Any) -> tuple[str, ...]:
    import comm2perfetto

    roots = [os.path.dirname(torch.__file__) + os.sep, os.path.dirname(comm2perfetto.__file__) + os.sep]
    import contextlib
    import functools

    roots += [functools.__file__, contextlib.__file__]
    return tuple(roots)
