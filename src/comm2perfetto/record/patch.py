"""The patch layer: timed wrappers around every public ``torch.distributed`` collective and p2p call, and around
the functional collectives DTensor uses.

``install()`` replaces each function in ``torch.distributed.distributed_c10d`` and in ``torch.distributed``
with a wrapper, ``install_functional()`` each one in ``torch.distributed._functional_collectives``;
``uninstall()`` puts the originals back. All are idempotent. A wrapper whose process is not recording
(``state.recorder is None``) calls straight through, and calls nested inside a recorded call
(``all_gather_object`` issuing ``all_gather``) are not recorded again: the outer call covers their sequence
numbers (``seq..seq_last`` in the log). The wrappers themselves are recorder.recording_wrapper.

Patching happens when ``torch.distributed.distributed_c10d`` finishes importing (see bootstrap.py), before
``torch.distributed`` copies the names into its namespace and before user modules run
``from torch.distributed import all_reduce``; so those see the wrappers too. The functional collectives are
patched when their module finishes importing; DTensor calls them as ``funcol.all_reduce(...)``. What never
passes through these functions (DDP's and FSDP1's collectives, issued from C++; the backward of a functional
collective called outside DTensor, run by autograd) is covered by Flight Recorder instead.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OpSpec:
    """How to read one function's arguments.

    ``inputs`` name the parameters holding the input tensors (a tensor, a list of tensors, or a list of
    P2POp); ``peers`` the parameters holding the peer rank, each with whether it is a group rank. ``multi``:
    one call issues several collectives, so the group's counter is read again afterwards (as for p2p ops,
    whose gloo implementation consumes collective sequence numbers). ``functional``: a function of
    ``torch.distributed._functional_collectives`` (its ``group`` may be a group name, a rank list, a
    DeviceMesh or a ``(mesh, dim)`` pair; it returns at once with an AsyncCollectiveTensor).
    """

    name: str
    inputs: tuple[str, ...] = ()
    peers: tuple[tuple[str, bool], ...] = ()
    p2p: bool = False
    always_async: bool = False
    multi: bool = False
    functional: bool = False


_DST = (("dst", False), ("group_dst", True))
_SRC = (("src", False), ("group_src", True))

# torch.distributed.distributed_c10d. Deprecated names that call their successor (all_gather_into_tensor calls
# all_gather_single on 2.13) are wrapped too: the outer call is recorded, the nested one passes through.
OPS: tuple[OpSpec, ...] = (
    OpSpec("all_reduce", ("tensor",)),
    OpSpec("reduce", ("tensor",), _DST),
    OpSpec("broadcast", ("tensor",), _SRC),
    OpSpec("all_gather", ("tensor",)),
    OpSpec("all_gather_single", ("input_tensor",)),
    OpSpec("all_gather_into_tensor", ("input_tensor",)),
    OpSpec("_all_gather_base", ("input_tensor",)),
    OpSpec("all_gather_object", multi=True),
    OpSpec("gather", ("tensor",), _DST),
    OpSpec("gather_object", (), _DST, multi=True),
    OpSpec("scatter", ("tensor",), _SRC),
    OpSpec("scatter_object_list", (), _SRC, multi=True),
    OpSpec("reduce_scatter", ("input_list",)),
    OpSpec("reduce_scatter_single", ("input",)),
    OpSpec("reduce_scatter_tensor", ("input",)),
    OpSpec("_reduce_scatter_base", ("input",)),
    OpSpec("all_to_all", ("input_tensor_list",)),
    OpSpec("all_to_all_single", ("input",)),
    OpSpec("barrier"),
    OpSpec("monitored_barrier", multi=True),
    OpSpec("broadcast_object_list", (), _SRC, multi=True),
    OpSpec("send", ("tensor",), _DST, p2p=True),
    OpSpec("recv", ("tensor",), _SRC, p2p=True),
    OpSpec("isend", ("tensor",), _DST, p2p=True, always_async=True),
    OpSpec("irecv", ("tensor",), _SRC, p2p=True, always_async=True),
    OpSpec("batch_isend_irecv", ("p2p_op_list",), p2p=True, always_async=True),
    OpSpec("send_object_list", (), _DST, p2p=True),
    OpSpec("recv_object_list", (), _SRC, p2p=True),
)


def _functional(name: str, inputs: str = "self", peers: tuple[tuple[str, bool], ...] = (),
                multi: bool = False) -> OpSpec:
    return OpSpec(name, (inputs,), peers, always_async=True, multi=multi, functional=True)


# torch.distributed._functional_collectives, which DTensor and tensor parallelism call through the module
# attribute (``funcol.all_reduce(...)``). Each issues one ``_c10d_functional`` op, which CommDebugMode counts.
FUNCTIONAL_OPS: tuple[OpSpec, ...] = (
    _functional("all_reduce"),
    _functional("broadcast", peers=(("src", True),)),
    _functional("all_gather_single"),
    _functional("all_gather_single_autograd"),
    _functional("all_gather_tensor"),
    _functional("all_gather_tensor_autograd"),
    _functional("reduce_scatter_single"),
    _functional("reduce_scatter_single_autograd"),
    _functional("reduce_scatter_tensor"),
    _functional("reduce_scatter_tensor_autograd"),
    _functional("all_to_all_single"),
    _functional("all_to_all_single_autograd"),
    _functional("all_reduce_coalesced", multi=True),
    _functional("all_gather_single_coalesced", multi=True),
    _functional("all_gather_into_tensor_coalesced", multi=True),
    _functional("reduce_scatter_single_coalesced", "inputs", multi=True),
    _functional("reduce_scatter_tensor_coalesced", "inputs", multi=True),
)

_ABSENT = 1 << 30  # position of a parameter the function does not have: never within args


class BoundSpec:
    """An OpSpec resolved against the wrapped function's signature: argument positions, so the hot path
    reads ``args[i]`` instead of binding the signature."""

    __slots__ = (
        "always_async",
        "async_op",
        "collective",
        "functional",
        "group",
        "has_peer",
        "input_pos",
        "inputs",
        "name",
        "peers",
        "single",
        "spec",
        "tracing",
    )

    def __init__(self, spec: OpSpec, params: tuple[str, ...], tracing: Callable[[], bool] | None = None) -> None:
        index = {name: i for i, name in enumerate(params)}
        self.spec = spec
        self.name = spec.name
        self.inputs = tuple((index.get(n, _ABSENT), n) for n in spec.inputs)
        # The hot path's shortcut: the position of the only input parameter (a tensor, or a list of them).
        self.input_pos = self.inputs[0][0] if len(self.inputs) == 1 else _ABSENT
        self.group = index.get("group", _ABSENT)
        self.async_op = index.get("async_op", _ABSENT)
        self.peers = tuple((index.get(n, _ABSENT), n, is_group) for n, is_group in spec.peers)
        self.single = not spec.multi and not spec.p2p
        self.always_async = spec.always_async
        self.collective = not spec.p2p  # p2p ops get no collective sequence number of their own
        self.has_peer = bool(spec.peers) or spec.name == "batch_isend_irecv"
        self.functional = spec.functional
        # Functional collectives also run while torch.compile or make_fx traces DTensor code, with fake tensors
        # and no collective issued: funcol's own test for that, so those calls are not recorded.
        self.tracing = tracing


# (module, name, torch's function) for each replacement, in order: what uninstall() puts back.
_replaced: list[tuple[Any, str, Any]] = []


def _make_wrapper(spec: OpSpec, original: Any, tracing: Callable[[], bool] | None = None) -> Any:
    from comm2perfetto.record.recorder import recording_wrapper

    bound = BoundSpec(spec, tuple(inspect.signature(original).parameters), tracing)
    wrapper = recording_wrapper(bound, original)
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


_HOOKS = (("_update_default_pg", _make_pg_hook), ("destroy_process_group", _make_destroy_hook))


def _replace(module: Any, name: str, factory: Callable[[Any], Any]) -> None:
    original = getattr(module, name, None)
    if original is None or hasattr(original, "__c2p_original__"):
        return  # an older torch without this function, or wrapped already
    setattr(module, name, factory(original))
    _replaced.append((module, name, original))


def install(c10d: Any, dist: Any | None = None) -> None:
    """Wrap every op of ``OPS`` in ``c10d`` (``torch.distributed.distributed_c10d``) and, when given, the
    same names in ``dist`` (``torch.distributed``). Idempotent."""
    for spec in OPS:
        _replace(c10d, spec.name, functools.partial(_make_wrapper, spec))
    for name, factory in _HOOKS:
        _replace(c10d, name, factory)
    if dist is None:
        return
    for name in [spec.name for spec in OPS] + [name for name, _ in _HOOKS]:
        wrapper = getattr(c10d, name, None)
        original = getattr(wrapper, "__c2p_original__", None)
        if original is not None and getattr(dist, name, None) is original:
            setattr(dist, name, wrapper)
            _replaced.append((dist, name, original))


def install_functional(funcol: Any) -> None:
    """Wrap every op of ``FUNCTIONAL_OPS`` in ``torch.distributed._functional_collectives``. Idempotent."""
    tracing = getattr(funcol, "_are_we_tracing", None)
    for spec in FUNCTIONAL_OPS:
        _replace(funcol, spec.name, functools.partial(_make_wrapper, spec, tracing=tracing))


def uninstall() -> None:
    """Put every original function back where a wrapper was installed (unless someone replaced our wrapper
    since). Idempotent."""
    while _replaced:
        module, name, original = _replaced.pop()
        if getattr(getattr(module, name, None), "__c2p_original__", None) is original:
            setattr(module, name, original)


def installed() -> bool:
    return bool(_replaced)
