"""The operations the recorder wraps, as data: which ``torch.distributed`` functions, how to read their
arguments, and what kind of call each is.

``OPS`` lists the functions of ``torch.distributed.distributed_c10d`` (and the same names in
``torch.distributed``), ``FUNCTIONAL_OPS`` those of ``torch.distributed._functional_collectives``. The patch
layer (patch.py) wraps each; ``bind`` resolves an entry against the function's real signature once, so that the
recorder's hot path (recorder.recording_wrapper) reads ``args[i]`` instead of binding the signature per call.

An entry names parameters, as torch's signatures do::

    def broadcast(tensor, src=None, group=None, async_op=False, group_src=None)
    OpSpec("broadcast", inputs=("tensor",), peers=(("src", False), ("group_src", True)))
    bound: inputs ((0, "tensor"),), group 2, async_op 3, peers ((1, "src", False), (4, "group_src", True))

Calls whose sizes gloo checks only by aborting the receiving rank (all-to-all splits, the object collectives' list
lengths) also name the parameters whose sizes the recorder logs (``extents``, the `b` record's ``sizes``)::

    def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None, ...)
    OpSpec("all_to_all_single", ("input",), extents=(("input_split_sizes", SPLITS),
                                                     ("output_split_sizes", SPLITS), ("output", SHAPE)))
    logged: [[3, 2], [2, 3], [5]]   (or [null, null, [4]] for the even split)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OpSpec:
    """How to read one function's arguments.

    ``inputs`` name the parameters holding the input tensors (a tensor, a list of tensors, or a list of
    P2POp); ``peers`` the parameters holding the peer rank, each with whether it is a group rank. ``p2p``: a
    point-to-point op (no collective sequence number of its own). ``p2p_ops``: its input is a list of P2POp,
    each naming its own peer (``batch_isend_irecv``). ``always_async``: it returns before its work completes,
    whatever ``async_op`` says. ``multi``: one call issues several collectives, so the group's counter is read
    again afterwards (as for p2p ops, whose gloo implementation consumes collective sequence numbers).
    ``functional``: a function of ``torch.distributed._functional_collectives`` (its ``group`` may be a group
    name, a rank list, a DeviceMesh or a ``(mesh, dim)`` pair; it returns at once with an
    AsyncCollectiveTensor). An op without ``inputs`` (barrier, the object collectives) has no argument
    signature and no byte count. ``extents``: the parameters whose sizes the `b` record's ``sizes`` field
    lists, in this order, each with what is logged of it (``SPLITS``, ``SHAPE``, ``SHAPES``, ``COUNT``).
    """

    name: str
    inputs: tuple[str, ...] = ()
    peers: tuple[tuple[str, bool], ...] = ()
    p2p: bool = False
    p2p_ops: bool = False
    always_async: bool = False
    multi: bool = False
    functional: bool = False
    extents: tuple[tuple[str, str], ...] = ()


# What the `b` record's ``sizes`` field holds of each parameter an OpSpec's ``extents`` names (null for None):
SPLITS = "splits"  # a list of split sizes, as ints (all_to_all_single's; null: not given, the even split)
SHAPE = "shape"  # a tensor's shape
SHAPES = "shapes"  # the shapes of a list of tensors
COUNT = "count"  # the length of a list (of objects): free to read, where their pickled size is not

_DST = (("dst", False), ("group_dst", True))
_SRC = (("src", False), ("group_src", True))
_A2A_SPLITS = (("input_split_sizes", SPLITS), ("output_split_sizes", SPLITS))
_OBJECTS = (("object_list", COUNT),)

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
    OpSpec("all_gather_object", multi=True, extents=_OBJECTS),
    OpSpec("gather", ("tensor",), _DST),
    OpSpec("gather_object", (), _DST, multi=True, extents=(("object_gather_list", COUNT),)),
    OpSpec("scatter", ("tensor",), _SRC),
    OpSpec("scatter_object_list", (), _SRC, multi=True, extents=(("scatter_object_input_list", COUNT),)),
    OpSpec("reduce_scatter", ("input_list",)),
    OpSpec("reduce_scatter_single", ("input",)),
    OpSpec("reduce_scatter_tensor", ("input",)),
    OpSpec("_reduce_scatter_base", ("input",)),
    OpSpec("all_to_all", ("input_tensor_list",), extents=(("output_tensor_list", SHAPES),)),
    OpSpec("all_to_all_single", ("input",), extents=_A2A_SPLITS + (("output", SHAPE),)),
    OpSpec("barrier"),
    OpSpec("monitored_barrier", multi=True),
    OpSpec("broadcast_object_list", (), _SRC, multi=True, extents=_OBJECTS),
    OpSpec("send", ("tensor",), _DST, p2p=True),
    OpSpec("recv", ("tensor",), _SRC, p2p=True),
    OpSpec("isend", ("tensor",), _DST, p2p=True, always_async=True),
    OpSpec("irecv", ("tensor",), _SRC, p2p=True, always_async=True),
    OpSpec("batch_isend_irecv", ("p2p_op_list",), p2p=True, p2p_ops=True, always_async=True),
    OpSpec("send_object_list", (), _DST, p2p=True, extents=_OBJECTS),
    OpSpec("recv_object_list", (), _SRC, p2p=True, extents=_OBJECTS),
)


def _functional(name: str, inputs: str = "self", peers: tuple[tuple[str, bool], ...] = (),
                multi: bool = False, extents: tuple[tuple[str, str], ...] = ()) -> OpSpec:
    return OpSpec(name, (inputs,), peers, always_async=True, multi=multi, functional=True, extents=extents)


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
    _functional("all_to_all_single", extents=_A2A_SPLITS),  # its output is made from the splits: no shape
    _functional("all_to_all_single_autograd", extents=_A2A_SPLITS),
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
        "extents",
        "functional",
        "group",
        "has_peer",
        "input_pos",
        "inputs",
        "name",
        "p2p_ops",
        "peers",
        "single",
        "spec",
        "tail",
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
        self.p2p_ops = spec.p2p_ops
        self.single = not spec.multi and not spec.p2p
        self.always_async = spec.always_async
        self.collective = not spec.p2p  # p2p ops get no collective sequence number of their own
        self.has_peer = bool(spec.peers) or spec.p2p_ops
        self.functional = spec.functional
        self.extents = tuple((index.get(n, _ABSENT), n, kind) for n, kind in spec.extents)
        # The `b` record's optional trailing fields that every call of this function has (``functional``, then
        # ``from_cpp``, as 0 where only the ``sizes`` after them are there), or None: the hot path's one test
        # for all of them.
        self.tail = (int(spec.functional), 0) if spec.extents else (1,) if spec.functional else None
        # Functional collectives also run while torch.compile or make_fx traces DTensor code, with fake tensors
        # and no collective issued: funcol's own test for that, so those calls are not recorded.
        self.tracing = tracing


def bind(spec: OpSpec, function: Callable[..., Any], tracing: Callable[[], bool] | None = None) -> BoundSpec:
    """``spec`` resolved against ``function``'s parameters (torch's function that a wrapper replaces)."""
    return BoundSpec(spec, tuple(inspect.signature(function).parameters), tracing)


# A point-to-point call's direction, by its name (a batch's ops are named by their function: ``isend``, ``irecv``).
P2P_KIND = {"send": "send", "isend": "send", "recv": "recv", "irecv": "recv", "send_object_list": "send",
            "recv_object_list": "recv"}


def p2p_keys(record: list) -> list[tuple[int, str, int]]:
    """(gid, "send"/"recv", peer) of each op of a point-to-point call's `b` record (a batch lists
    ``[op, peer]`` pairs); a recv from any source (peer None) has none.

    >>> p2p_keys(["b", 7, 1795313447406614332, "batch_isend_irecv", 0, None, [["isend", 1], ["irecv", 2]]])
    [(0, 'send', 1), (0, 'recv', 2)]
    """
    peers = record[6]
    pairs = peers if isinstance(peers, list) else [(record[3], peers)]
    return [(record[4], P2P_KIND[str(op)], peer) for op, peer in pairs
            if isinstance(peer, int) and str(op) in P2P_KIND]
