"""Job-wide interning of call stacks and signatures, shared by every rank's Flight Recorder reader.

A 1024-rank job has two million entries but a handful of distinct call paths and collective signatures:
each is stored once and referred to by index (stacks) or identity (signatures). Never imports torch.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Sequence
from typing import Any

from comm2perfetto.model import Frame, Signature, Stack
from comm2perfetto.sources.limits import count_ok


def contiguous(seqs: Sequence[int]) -> bool:
    """One row per seq, consecutive (FR lists a group's collectives in seq order)."""
    return len(seqs) > 0 and seqs[-1] - seqs[0] + 1 == len(seqs)


class StackTable:
    """Job-wide interning of stacks, so each distinct call path is stored once and referred to by index."""

    def __init__(self) -> None:
        self.stacks: list[Stack] = []
        self._index: dict[Stack, int] = {}
        self._frames: dict[tuple[str, int, str], Frame] = {}

    def frame(self, file: str, line: int, func: str) -> Frame:
        key = (file, line, func)
        fr = self._frames.get(key)
        if fr is None:
            fr = self._frames[key] = Frame(file, line, func)
        return fr

    def intern(self, stack: Stack) -> int:
        sid = self._index.get(stack)
        if sid is None:
            sid = self._index[stack] = len(self.stacks)
            self.stacks.append(stack)
        return sid


class SignatureTable:
    """Job-wide interning of signatures.

    Hashing a signature means converting its nested lists to tuples, about a microsecond an entry. Ranks of
    one job issue the same collectives, so the first rank's raw columns are kept per group and a later
    rank's columns are compared with them slice-wise (``==`` on tuples of lists runs in C): where equal,
    the first rank's signatures are reused. Only what differs is converted entry by entry.

    Converting is the check of the four signature fields: a size or dtype list that is not one (``[[4]]``,
    ``["Float"]``) reads as unknown (None), and the rows where that happened are returned, with the fields,
    so that the reader names them (a damaged dtype must not read as a dtype mismatch).
    """

    def __init__(self) -> None:
        self._by_value: dict[Signature, Signature] = {}
        self._first: dict[tuple[str, int], tuple[tuple, Signature, tuple[str, ...]]] = {}
        # group name -> (seqs, names, in_s, in_d, out_s, out_d, ids, table, damaged rows)
        self._ref: dict[str, tuple] = {}

    def intern(self, sig: Signature) -> Signature:
        return self._by_value.setdefault(sig, sig)

    def from_raw(self, pg_name: str, seq: int, raw: tuple) -> Signature:
        """One entry's signature; ``raw`` is (op, input_sizes, input_dtypes, output_sizes, output_dtypes)."""
        return self.checked(pg_name, seq, raw)[0]

    def checked(self, pg_name: str, seq: int, raw: tuple) -> tuple[Signature, tuple[str, ...]]:
        """``from_raw``, and the names of the fields of ``raw`` that failed their check (read as unknown)."""
        key = (pg_name, seq)
        first = self._first.get(key)
        if first is not None and first[0] == raw:
            return first[1], first[2]
        op, in_s, in_d, out_s, out_d = raw
        in_sizes, in_dtypes, out_sizes, out_dtypes = _sizes(in_s), _names(in_d), _sizes(out_s), _names(out_d)
        sig = self.intern(Signature(op, in_sizes, in_dtypes, out_sizes, out_dtypes, "fr"))
        damaged: tuple[str, ...] = ()
        if in_sizes is None or in_dtypes is None or out_sizes is None or out_dtypes is None:  # absent, or failed
            read = (in_sizes, in_dtypes, out_sizes, out_dtypes)
            damaged = tuple(name for name, value, got in zip(SIGNATURE_FIELDS, raw[1:], read)
                            if got is None and value is not None)
        if first is None:
            self._first[key] = (raw, sig, damaged)
        return sig, damaged

    def column(self, pg_name: str, seqs: Sequence[int], names: tuple, parts: dict, in_s: tuple, in_d: tuple,
               out_s: tuple, out_d: tuple) -> tuple[array, list[Signature], list[tuple[int, tuple[str, ...]]]]:
        """Signatures of one rank's collectives on one group (columns aligned by row), as ids (int32, one a
        row) into a small table of distinct signatures; and the rows whose signature fields failed their
        check, with those fields (usually none)."""
        ref = self._ref.get(pg_name)
        n = len(seqs)
        if ref is not None and n and contiguous(seqs) and contiguous(ref[0]):
            r_seqs = ref[0]
            lo, hi = max(seqs[0], r_seqs[0]), min(seqs[-1], r_seqs[-1])
            if lo <= hi:
                a, b, k = lo - seqs[0], lo - r_seqs[0], hi - lo + 1
                if (names[a:a + k] == ref[1][b:b + k] and in_s[a:a + k] == ref[2][b:b + k]
                        and out_s[a:a + k] == ref[4][b:b + k] and in_d[a:a + k] == ref[3][b:b + k]
                        and out_d[a:a + k] == ref[5][b:b + k]):
                    r_ids, r_table = ref[6], ref[7]
                    # the first rank's damage where this rank's values are the same
                    same = [(a + row - b, fields) for row, fields in ref[8] if b <= row < b + k]
                    if not a and k == n:  # the common case: the same collectives as the first rank
                        return r_ids[b:b + k], list(r_table), same
                    head, head_bad = self._each(pg_name, seqs[:a], names[:a], parts, in_s[:a], in_d[:a],
                                                out_s[:a], out_d[:a])
                    tail, tail_bad = self._each(pg_name, seqs[a + k:], names[a + k:], parts, in_s[a + k:],
                                                in_d[a + k:], out_s[a + k:], out_d[a + k:])
                    ids, table = encode([*head, *map(r_table.__getitem__, r_ids[b:b + k]), *tail])
                    return ids, table, head_bad + same + [(a + k + row, f) for row, f in tail_bad]
        sigs, damaged = self._each(pg_name, seqs, names, parts, in_s, in_d, out_s, out_d)
        ids, table = encode(sigs)
        if ref is None and n and contiguous(seqs):
            self._ref[pg_name] = (seqs, names, in_s, in_d, out_s, out_d, ids, table, damaged)
        return ids, list(table), damaged

    def _each(self, pg_name: str, seqs, names, parts, in_s, in_d, out_s, out_d) -> tuple[list[Signature], list]:
        ops = [parts[n][1] for n in names]
        sigs, damaged = [], []
        for row, (q, raw) in enumerate(zip(seqs, zip(ops, in_s, in_d, out_s, out_d))):
            sig, bad = self.checked(pg_name, q, raw)
            sigs.append(sig)
            if bad:
                damaged.append((row, bad))
        return sigs, damaged


# The entry fields a signature is made of, after the op (the order of ``raw`` above).
SIGNATURE_FIELDS = ("input_sizes", "input_dtypes", "output_sizes", "output_dtypes")


def encode(sigs: Sequence[Signature]) -> tuple[array, list[Signature]]:
    """Signature objects, one a row, as ids (int32) into a table of the distinct ones (by identity: interned
    signatures are one object per value)."""
    by_id = dict(zip(map(id, sigs), sigs))  # a handful of distinct objects among thousands of rows
    ids = {k: i for i, k in enumerate(by_id)}
    return array("i", map(ids.__getitem__, map(id, sigs))), list(by_id.values())


def sizes_ok(raw: Any) -> bool:
    return _sizes(raw) is not None


def dtypes_ok(raw: Any) -> bool:
    return _names(raw) is not None


def _sizes(raw: Any) -> tuple[tuple[int, ...], ...] | None:
    """``[[4, 8], [2]]`` -> ((4, 8), (2,)); None (unknown) unless every size is a list of counts."""
    if not isinstance(raw, (list, tuple)):
        return None
    out = []
    for s in raw:
        if not isinstance(s, (list, tuple)) or not all(map(count_ok, s)):
            return None
        out.append(tuple(s))
    return tuple(out)


# A dtype as c10 names it: "Float", "BFloat16", "Float8_e4m3fn", "ComplexHalf", "QUInt4x2".
_DTYPE = re.compile(r"[A-Z][A-Za-z0-9_]{0,39}")
_DTYPE_NAMES: set[str] = set()


def _names(raw: Any) -> tuple[str, ...] | None:
    """``["Float"]`` -> ("Float",); None (unknown) unless every dtype is a dtype's name.

    >>> _names(["Float", "BFloat16"]), _names("Float"), _names(["zero"]), _names([5])
    (('Float', 'BFloat16'), ('Float',), None, None)
    """
    if isinstance(raw, str):  # some writers (and torch's own tests) store one dtype as a bare string
        raw = (raw,)
    if not isinstance(raw, (list, tuple)):
        return None
    for x in raw:
        if type(x) is not str:
            return None
        if x not in _DTYPE_NAMES:
            if not _DTYPE.fullmatch(x):
                return None
            if len(_DTYPE_NAMES) < 4096:
                _DTYPE_NAMES.add(x)  # every entry repeats a few names: each is matched once
    return tuple(raw)


def stack_id(frames: list[dict[str, Any]], frame_cache: dict[int, Frame], stacks: StackTable) -> int:
    out = []
    for f in frames:
        fr = frame_cache.get(id(f))
        if fr is None:
            if not isinstance(f, dict):
                continue
            file, line, func = f.get("filename"), f.get("line", 0) or 0, f.get("name")
            fr = stacks.frame(file if isinstance(file, str) else "?", line if count_ok(line) else 0,
                              func if isinstance(func, str) else "")
            frame_cache[id(f)] = fr
        out.append(fr)
    return stacks.intern(tuple(out))
