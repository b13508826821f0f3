"""The patch layer: timed wrappers around every public ``torch.distributed`` collective and p2p call.

``install()`` replaces each function in ``torch.distributed.distributed_c10d`` and in ``torch.distributed``
with a wrapper; ``uninstall()`` puts the originals back. Both are idempotent. A wrapper whose process is not
recording (``state.recorder is None``) calls straight through, and calls nested inside a recorded call
(``all_gather_object`` issuing ``all_gather``) are not recorded again: the outer call covers their sequence
numbers (``seq..seq_last`` in the log).

Patching happens when ``torch.distributed.distributed_c10d`` finishes importing (see bootstrap.py), before
``torch.distributed`` copies the names into its namespace and before user modules run
``from torch.distributed import all_reduce``; so those see the wrappers too. What never passes through these
functions (DDP's and FSDP's collectives, issued from C++) is covered by Flight Recorder instead.
"""

from __future__ import annotations

import functools
import inspect
import threading
from dataclasses import dataclass
from typing import Any

from comm2perfetto.record import state


@dataclass(frozen=True)
class OpSpec:
    """How to read one function's arguments.

    ``inputs`` name the parameters holding the input tensors (a tensor, a list of tensors, or a list of
    P2POp); ``peers`` the parameters holding the peer rank, each with whether it is a group rank.
    """

    name: str
    inputs: tuple[str, ...] = ()
    peers: tuple[tuple[str, bool], ...] = ()
    p2p: bool = False
    always_async: bool = False


_DST = (("dst", False), ("group_dst", True))
_SRC = (("src", False), ("group_src", True))

OPS: tuple[OpSpec, ...] = (
    OpSpec("all_reduce", ("tensor",)),
    OpSpec("reduce", ("tensor",), _DST),
    OpSpec("broadcast", ("tensor",), _SRC),
    OpSpec("all_gather", ("tensor",)),
    OpSpec("all_gather_into_tensor", ("input_tensor",)),
    OpSpec("_all_gather_base", ("input_tensor",)),
    OpSpec("all_gather_object"),
    OpSpec("gather", ("tensor",), _DST),
    OpSpec("gather_object", (), _DST),
    OpSpec("scatter", ("tensor",), _SRC),
    OpSpec("scatter_object_list", (), _SRC),
    OpSpec("reduce_scatter", ("input_list",)),
    OpSpec("reduce_scatter_tensor", ("input",)),
    OpSpec("_reduce_scatter_base", ("input",)),
    OpSpec("all_to_all", ("input_tensor_list",)),
    OpSpec("all_to_all_single", ("input",)),
    OpSpec("barrier"),
    OpSpec("monitored_barrier"),
    OpSpec("broadcast_object_list", (), _SRC),
    OpSpec("send", ("tensor",), _DST, p2p=True),
    OpSpec("recv", ("tensor",), _SRC, p2p=True),
    OpSpec("isend", ("tensor",), _DST, p2p=True, always_async=True),
    OpSpec("irecv", ("tensor",), _SRC, p2p=True, always_async=True),
    OpSpec("batch_isend_irecv", ("p2p_op_list",), p2p=True, always_async=True),
    OpSpec("send_object_list", (), _DST, p2p=True),
    OpSpec("recv_object_list", (), _SRC, p2p=True),
)


# Ops that issue several collectives per call, or p2p ops (gloo's consume collective sequence numbers): their
# group counter is read again after the call. For the others the last sequence number is the first.
_MULTI = {"all_gather_object", "gather_object", "scatter_object_list", "broadcast_object_list",
          "monitored_barrier", "send_object_list", "recv_object_list"}

_ABSENT = 1 << 30  # position of a parameter the function does not have: never within args


class BoundSpec:
    """An OpSpec resolved against the wrapped function's signature: argument positions, so the hot path
    reads ``args[i]`` instead of binding the signature."""

    __slots__ = ("spec", "name", "inputs", "group", "async_op", "peers", "single", "always_async",
                 "collective", "has_peer")

    def __init__(self, spec: OpSpec, params: tuple[str, ...]) -> None:
        index = {name: i for i, name in enumerate(params)}
        self.spec = spec
        self.name = spec.name
        self.inputs = tuple((index.get(n, _ABSENT), n) for n in spec.inputs)
        self.group = index.get("group", _ABSENT)
        self.async_op = index.get("async_op", _ABSENT)
        self.peers = tuple((index.get(n, _ABSENT), n, is_group) for n, is_group in spec.peers)
        self.single = not spec.p2p and spec.name not in _MULTI
        self.always_async = spec.always_async
        self.collective = not spec.p2p  # p2p ops get no collective sequence number of their own
        self.has_peer = bool(spec.peers) or spec.name == "batch_isend_irecv"


class _Busy(threading.local):
    """Set while a recorded call runs on this thread, so nested torch.distributed calls pass through."""

    active = False


busy = _Busy()

_originals: dict[str, Any] = {}
_installed_on: list[Any] = []


def _make_wrapper(spec: OpSpec, original: Any) -> Any:
    bound = BoundSpec(spec, tuple(inspect.signature(original).parameters))

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        rec = state.recorder
        if rec is None or busy.active:
            return original(*args, **kwargs)
        return rec.record_call(bound, original, args, kwargs)

    wrapper.__c2p_original__ = original  # type: ignore[attr-defined]
    return wrapper


def _make_pg_hook(original: Any) -> Any:
    """Wrap ``_update_default_pg``: every way of creating the default group (init_process_group,
    init_device_mesh, elastic re-init) goes through it, so recording starts right after."""

    @functools.wraps(original)
    def update_default_pg(pg: Any) -> Any:
        result = original(pg)
        if pg is not None:
            from comm2perfetto.record import session

            session.on_default_group(pg)
        return result

    update_default_pg.__c2p_original__ = original  # type: ignore[attr-defined]
    return update_default_pg


def _make_destroy_hook(original: Any) -> Any:
    """Dump Flight Recorder before the default group goes away (its entries may go with it)."""

    @functools.wraps(original)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        from comm2perfetto.record import session

        rec = session.active_recorder()  # also after a fault disabled the wrappers: FR dumps go on
        group = args[0] if args else kwargs.get("group")
        if rec is not None and group is None:
            rec.dump_flight_recorder("destroy")
        return original(*args, **kwargs)

    destroy_process_group.__c2p_original__ = original  # type: ignore[attr-defined]
    return destroy_process_group


def install(c10d: Any, dist: Any | None = None) -> None:
    """Wrap every op of ``OPS`` in ``c10d`` (``torch.distributed.distributed_c10d``) and, when given, the
    same names in ``dist`` (``torch.distributed``). Idempotent."""
    if not _originals:
        for spec in OPS:
            original = getattr(c10d, spec.name, None)
            if original is None or hasattr(original, "__c2p_original__"):
                continue  # older torch without this op, or wrapped already
            _originals[spec.name] = original
            setattr(c10d, spec.name, _make_wrapper(spec, original))
        for name, factory in (("_update_default_pg", _make_pg_hook),
                              ("destroy_process_group", _make_destroy_hook)):
            original = getattr(c10d, name, None)
            if original is not None and not hasattr(original, "__c2p_original__"):
                _originals[name] = original
                setattr(c10d, name, factory(original))
        _installed_on.append(c10d)
    if dist is not None and dist not in _installed_on:
        for name, original in _originals.items():
            if getattr(dist, name, None) is original:
                setattr(dist, name, getattr(c10d, name))
        _installed_on.append(dist)


def uninstall() -> None:
    """Put every original function back where a wrapper was installed. Idempotent."""
    for module in _installed_on:
        for name, original in _originals.items():
            current = getattr(module, name, None)
            if getattr(current, "__c2p_original__", None) is original:
                setattr(module, name, original)
    _installed_on.clear()
    _originals.clear()


def installed() -> bool:
    return bool(_originals)
