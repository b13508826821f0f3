"""When do two ranks' signatures for one collective agree? Pure functions, no torch.

Follows torch's Flight Recorder analyzer (``torchfrtrace``) where its rules apply: op names, then input and
output sizes, then dtypes; an all-gather's output must be group size x its input, a reduce-scatter's input the
reverse. Unlike it, sizes are allowed to differ where ranks legitimately differ: the all-to-all family, ``*_v``
ops, object collectives, scatter inputs and gather outputs. A record from the recorder's event log (public
function name, input shapes only) is compared with a Flight Recorder entry by op family and input sizes; one
from a profiler trace (``kineto``: element counts, no shapes) with another source by op family and element count.
"""

from __future__ import annotations

import math

from comm2perfetto.model import ROOTED_FAMILIES, Signature, op_family

_GATHER_LIKE = ("gather", "gather_object")
_SCATTER_LIKE = ("scatter", "scatter_object_list")
# Gloo implements reduce_scatter_tensor with an all-reduce (FR says gloo:all_reduce, seen on 2.13).
_EQUIVALENT_FAMILIES = {frozenset({"reduce_scatter", "all_reduce"})}


def _sizes_must_match(op: str) -> tuple[bool, bool]:
    """Whether inputs, and outputs, must be equal across ranks for this op."""
    fam = op_family(op)
    if fam == "all_to_all" or op.endswith("_v") or "_v_" in op or op.endswith("_object") or \
            op in ("all_gather_object", "scatter_object_list", "gather_object", "broadcast_object_list"):
        return False, False
    if fam == "scatter":
        return False, True
    if fam == "gather":
        return True, False
    return True, True


def compare(a: Signature, b: Signature, group_size: int) -> str | None:
    """How b differs from a: ``op``, ``root`` (a broadcast, reduce, gather or scatter whose src/dst differ),
    ``size``, ``dtype`` or None (compatible)."""
    if a is b:
        return None
    if a.parts or b.parts:
        if a.op != b.op or len(a.parts) != len(b.parts):
            return "op"
        for pa, pb in zip(a.parts, b.parts):
            d = compare(pa, pb, group_size)
            if d is not None:
                return d
        return None
    same_source = a.source == b.source
    if same_source and a.op != b.op:
        # A signature joined from the recorder and Flight Recorder has the user's op and FR's name (``fr_op``):
        # against a Flight Recorder entry alone (a rank whose log is missing), FR's names are what compares.
        if (a.fr_op is None) == (b.fr_op is None) or (a.fr_op or a.op) != (b.fr_op or b.op):
            return "op"
    else:
        fa, fb = op_family(a.op), op_family(b.op)
        if fa != fb and frozenset({fa, fb}) not in _EQUIVALENT_FAMILIES:
            return "op"
    if a.root is not None and b.root is not None and a.root != b.root and op_family(a.op) in ROOTED_FAMILIES:
        return "root"
    check_in, check_out = _sizes_must_match(a.op)
    if not same_source:
        check_in = check_in and _sizes_must_match(b.op)[0] and op_family(a.op) == op_family(b.op)
        check_out = False  # the recorder does not know outputs
    if check_in and a.input_sizes is not None and b.input_sizes is not None and a.input_sizes != b.input_sizes:
        # a profiler trace knows element counts, not shapes: against another source, compare those
        if same_source or "kineto" not in (a.source, b.source) or _numel(a.input_sizes) != _numel(b.input_sizes):
            return "size"
    if check_out and a.output_sizes is not None and b.output_sizes is not None and \
            a.output_sizes != b.output_sizes:
        return "size"
    if same_source and a.source == "fr" and _bad_gather_scatter_numel(b, group_size):
        return "size"
    if _dtypes_differ(a.input_dtypes, b.input_dtypes, a.input_sizes, b.input_sizes) and op_family(a.op) not in (
            "scatter", "broadcast") and not a.op.endswith("_object"):
        return "dtype"
    if same_source and _dtypes_differ(a.output_dtypes, b.output_dtypes, a.output_sizes, b.output_sizes) and \
            op_family(a.op) != "gather":
        return "dtype"
    return None


def _dtypes_differ(da, db, sa, sb) -> bool:
    if not da or not db:
        return False
    if not _nonempty(sa) or not _nonempty(sb):
        return False  # e.g. a gather's non-root ranks have no output: nothing to compare
    return set(da) != set(db)


def _numel(sizes) -> int:
    return sum(math.prod(x) for x in sizes)


def _nonempty(sizes) -> bool:
    return sizes is None or (len(sizes) > 0 and any(len(s) > 0 for s in sizes))


def _bad_gather_scatter_numel(s: Signature, group_size: int) -> bool:
    """A rank whose all-gather output is not group size x its input (or reduce-scatter the reverse)."""
    if not s.input_sizes or not s.output_sizes or group_size < 1:
        return False
    fam = op_family(s.op)
    numel_in = sum(math.prod(x) for x in s.input_sizes)
    numel_out = sum(math.prod(x) for x in s.output_sizes)
    if fam == "all_gather" and s.op not in ("all_gather_object",):
        return numel_out != numel_in * group_size
    if fam == "reduce_scatter" and s.op not in ("all_reduce",):
        return numel_in != numel_out * group_size
    return False
