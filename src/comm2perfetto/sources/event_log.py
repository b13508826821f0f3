"""Reader for the recorder's per-rank event log (docs/log-format.md). Never imports torch.

Raw input, one JSON document per line::

    {"kind":"header","format":"comm2perfetto-events","version":1,"rank":0,"world_size":2,...}
    ["g",0,"0","default_pg",[0,1],"undefined",{"cpu":"gloo"}]
    ["a",1,[[4]],["Float"],16]
    ["b",7,1795313447406614332,"all_reduce",0,5,null,false,1396872,1,1,3,1]
    ["e",7,1795313447406980001,5]
    ["a",2,[[5]],["Float"],20]
    ["b",8,1795313447407000000,"all_to_all_single",0,6,null,false,1396872,1,1,3,2,0,0,[[3,2],[2,3],[5]]]

A log cut short by a dead process ends in NUL padding and maybe one torn line: both are tolerated and
reported in ``RankLog.problems``. Every record is checked against ``_FIELDS`` (types, ranges) before it
becomes model data; bad records are skipped and counted, one note per file. A `b` record's ``sizes`` (an
all-to-all's splits, an object collective's list length) is checked against the call's group and input shapes
(``_call_sizes``); a bad one is dropped, the call kept, and counted in a note of its own.
"""

from __future__ import annotations

import io
import mmap
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from comm2perfetto.errors import Comm2PerfettoError
from comm2perfetto.exchange import Exchange
from comm2perfetto.sources.limits import (
    MAX_JOB_NS,
    MAX_OFFSET_NS,
    MAX_WORLD_SIZE,
    MIN_TIME_NS,
    Ranks,
    TooLargeError,
    compact_ranks,
    count_ok,
    is_int,
    opt_time_ok,
    rank_ok,
    read_bounded,
    regular_file_problem,
    shown,
    time_ok,
    world_ok,
)

__all__ = ["Call", "Ending", "EventLogError", "Group", "Range", "RankLog", "Stall", "WindowGroup", "WindowOp",
           "WindowSummary", "is_event_log", "read_event_log"]

# Backends whose synchronous calls return once the work is done (match.py's rule; the recorder keeps a copy).
CPU_BACKENDS = frozenset({"gloo", "mpi", "ucc"})

FORMAT_NAME = "comm2perfetto-events"
SUPPORTED_VERSIONS = (1,)


class EventLogError(Comm2PerfettoError, ValueError):
    """The file is not a readable comm2perfetto event log."""


@dataclass
class Group:
    """A process group as the recorder declared it. ``backend`` is c10d's name for it (``gloo``, ``nccl``, and
    ``undefined`` for a group created without one); ``devices`` is the backend that runs a call on each
    device type (``{"cpu": "gloo"}``), None in logs written before it was recorded."""

    gid: int
    name: str
    desc: str
    ranks: Ranks  # a range where consecutive (``limits.compact_ranks``)
    backend: str
    devices: dict[str, str] | None = None

    def backend_for(self, device: str | None) -> str | None:
        """The backend that ran a call whose input tensors are on ``device`` (None: no tensor, or the log does
        not say), or None where that is not known.

        >>> Group(0, "0", "default_pg", range(2), "undefined", {"cpu": "gloo"}).backend_for(None)
        'gloo'
        >>> Group(0, "0", "default_pg", range(2), "cpu:gloo,cuda:nccl").backend_for("cuda")
        'nccl'
        """
        devices = self.devices or _backend_config(self.backend)
        if device is not None and device in devices:
            return devices[device]
        distinct = set(devices.values())
        return distinct.pop() if len(distinct) == 1 else None

    def completes_on_return(self, call: Call) -> bool:
        """Whether ``call`` had completed when it returned: a synchronous call on CPU tensors, or one that a
        backend running on the CPU ran, whatever the group's backend is called (``undefined``, ``cpu:gloo``)."""
        if call.is_async or call.functional:
            return False
        return call.device == "cpu" or self.backend_for(call.device) in CPU_BACKENDS


def _backend_config(backend: str) -> dict[str, str]:
    """c10d's backend string as device -> backend: ``cpu:gloo,cuda:nccl`` by device, ``gloo`` for every
    device (key ``""``), ``undefined`` (or nothing): {}."""
    if ":" in backend:
        pairs = [item.split(":", 1) for item in backend.split(",") if ":" in item]
        return {device.strip(): name.strip() for device, name in pairs}
    return {"": backend} if backend and backend != "undefined" else {}


@dataclass
class Call:
    """One ``torch.distributed`` call as the patch layer saw it. Times in ns; None when unknown.

    ``functional``: a functional collective (``torch.distributed._functional_collectives``, what DTensor and
    tensor parallelism use): it returns at once with a tensor to wait on; on CPU tensors ``t_done_ns`` is when
    the first wait on it returned (its completion at the latest), on a GPU None.
    ``from_cpp``: a collective issued from C++ (DDP's, FSDP's), which the dispatcher fallback recorded where
    Flight Recorder does not record gloo (torch 2.4-2.7): ``op`` names the torch.distributed function of the
    same collective, ``is_async`` is true, ``t_return_ns`` is when the work was enqueued.
    """

    cid: int
    op: str
    gid: int
    seq: int | None
    peer: int | None
    is_async: bool
    tid: int
    site: str | None
    nvtx: tuple[str, ...]
    module: str | None
    pass_: str | None
    step: int
    shapes: list
    dtypes: list
    nbytes: int | None
    t_call_ns: int
    t_return_ns: int | None = None
    t_done_ns: int | None = None
    seq_last: int | None = None
    error: str | None = None
    functional: bool = False
    from_cpp: bool = False
    captured: bool = False  # captured into a CUDA graph: issued at each replay, which no source sees
    # The input tensors' device type, where the recorder wrote it: on groups whose backend depends on it.
    device: str | None = None
    # From the `b` record's sizes (calls whose sizes gloo checks only by aborting a rank): an all-to-all's
    # elements to and from each peer; an object collective's list length (see model.Signature). None: not logged.
    exchange: Exchange | None = None
    objects: int | None = None

    @property
    def t_end_ns(self) -> int | None:
        """Completion when known; otherwise return for a synchronous call (completion on a CPU backend), and
        None for an async call whose completion was not seen (GPU work: its future completes at enqueue)."""
        if self.t_done_ns is not None:
            return self.t_done_ns
        return None if self.is_async else self.t_return_ns


@dataclass
class Range:
    rid: int
    name: str
    tid: int
    source: str
    t_begin_ns: int
    t_end_ns: int | None = None
    domain: str | None = None  # the NVTX domain, None for the default one


@dataclass
class Stall:
    t_ns: int
    reason: str
    trigger_rank: int | None
    cid: int | None
    stacks_file: str | None


@dataclass
class Ending:
    """How the process was being ended, as it wrote it (``u`` record): ``cause`` is ``signal`` (``detail``
    ``SIGINT``...) or ``exception`` (``detail`` ``RuntimeError: Connection reset by peer``...)."""

    t_ns: int
    cause: str
    detail: str


class WindowOp(NamedTuple):
    """One op of one group in a window summary: calls completed, their input bytes (None: one unknown), and the
    time of the ``timed`` ones whose completion was seen."""

    n: int
    nbytes: int | None
    time_ns: int
    timed: int


class WindowGroup(NamedTuple):
    issued: int | None  # collectives the group's counter advanced by (C++-issued ones too); None: no counter
    ops: dict[str, WindowOp]
    seqs: tuple[int, ...]  # the sampled collectives of the window
    arrivals_us: tuple[int, ...]  # and this rank's arrival at each, in µs after the window's t0


@dataclass
class WindowSummary:
    """One ``l`` record: what the rank's communication was in one live window (record/window.py). ``steps``:
    step boundaries in it; ``step_ns``: the median step; ``exposed_ns``: the time the training thread waited in
    communication, where known."""

    window: int
    t0_ns: int
    t1_ns: int
    steps: int
    step_ns: int | None
    exposed_ns: int | None
    groups: dict[str, WindowGroup]


@dataclass
class RankLog:
    path: Path
    header: dict[str, Any]
    groups: dict[int, Group] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    ranges: list[Range] = field(default_factory=list)
    marks: list[tuple[int, str, int, str]] = field(default_factory=list)
    steps: list[tuple[int, int, str]] = field(default_factory=list)
    clock_offset_ns: int | None = None
    clock_rtt_ns: int | None = None
    stalls: list[Stall] = field(default_factory=list)
    fr_dumps: list[tuple[int, str, str]] = field(default_factory=list)
    profiler_traces: list[tuple[int, str]] = field(default_factory=list)
    warnings: list[tuple[int, str]] = field(default_factory=list)
    thread_names: dict[int, str] = field(default_factory=dict)  # tid -> threading name, where written
    closed_reason: str | None = None
    endings: list[Ending] = field(default_factory=list)
    first_ns: int | None = None  # the first and last time any record carries: the log's horizon
    last_ns: int | None = None
    heartbeats: int = 0
    windows: list[WindowSummary] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def shift(self, offset_ns: int) -> None:
        """Move every time this log holds by ``offset_ns``, in place: from the rank's own clock onto the job's
        (``match.build_job`` does, once, after aligning the clocks). The header keeps the rank's own times."""
        if not offset_ns:
            return
        for call in self.calls:
            call.t_call_ns += offset_ns
            if call.t_return_ns is not None:
                call.t_return_ns += offset_ns
            if call.t_done_ns is not None:
                call.t_done_ns += offset_ns
        for rng in self.ranges:
            rng.t_begin_ns += offset_ns
            if rng.t_end_ns is not None:
                rng.t_end_ns += offset_ns
        for stall in self.stalls:
            stall.t_ns += offset_ns
        for ending in self.endings:
            ending.t_ns += offset_ns
        for window in self.windows:  # its arrivals are relative to its t0
            window.t0_ns += offset_ns
            window.t1_ns += offset_ns
        self.marks = [(t + offset_ns, name, tid, source) for t, name, tid, source in self.marks]
        self.steps = [(step, t + offset_ns, source) for step, t, source in self.steps]
        self.fr_dumps = [(t + offset_ns, path, reason) for t, path, reason in self.fr_dumps]
        self.profiler_traces = [(t + offset_ns, path) for t, path in self.profiler_traces]
        self.warnings = [(t + offset_ns if t is not None else None, message) for t, message in self.warnings]
        if self.first_ns is not None:
            self.first_ns += offset_ns
        if self.last_ns is not None:
            self.last_ns += offset_ns

    @property
    def rank(self) -> int:
        return int(self.header["rank"])

    @property
    def world_size(self) -> int:
        return int(self.header["world_size"])

    @property
    def closed_cleanly(self) -> bool:
        return self.closed_reason is not None


def is_event_log(head: bytes) -> bool:
    """True when the first bytes of a file look like an event log header."""
    return head.lstrip().startswith(b"{") and FORMAT_NAME.encode() in head[:4096]


# The note of a log without its closing record (readers that can see the process say more: sources.discover).
UNCLOSED = ": not closed cleanly (the rank died, or still runs): read up to its last record"


def read_event_log(path: str | Path) -> RankLog:
    """Parse one rank's event log. Raises EventLogError when the file is not one."""
    path = Path(path)
    try:
        data = read_bounded(path)
    except OSError as exc:
        raise EventLogError(f"{path}: cannot read ({exc.strerror})") from exc
    except (TooLargeError, EOFError, zlib.error) as exc:
        raise EventLogError(f"{path}: {exc}") from exc
    data = data.rstrip(b"\0")
    lines = io.BytesIO(data)  # one line at a time: a file of garbage lines costs no list of millions
    first = lines.readline()
    if not first.strip():
        raise EventLogError(f"{path}: empty file, not a comm2perfetto event log")
    try:
        header = orjson.loads(first)
    except orjson.JSONDecodeError as exc:
        raise EventLogError(f"{path}: first line is not JSON, not a comm2perfetto event log") from exc
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise EventLogError(f"{path}: no comm2perfetto event log header")
    version = header.get("version")
    if version not in SUPPORTED_VERSIONS:
        if isinstance(version, int) and version > max(SUPPORTED_VERSIONS):
            raise EventLogError(f"{path}: event log version {shown(version)} is newer than this reader "
                                f"(supports {SUPPORTED_VERSIONS}); upgrade comm2perfetto")
        raise EventLogError(f"{path}: unsupported event log version {shown(version)} (supports {SUPPORTED_VERSIONS})")
    world, rank = header.get("world_size"), header.get("rank")
    if not world_ok(world):
        raise EventLogError(f"{path}: header's world_size {shown(world)} is not a number of ranks "
                            f"from 1 to {MAX_WORLD_SIZE:,}")
    if not rank_ok(rank, world):
        raise EventLogError(f"{path}: header's rank {shown(rank)} is not a rank of its {world}-rank job")
    log = RankLog(path=path, header=_checked_header(header))
    if isinstance(log.header.get("wall_ns"), int):
        log.first_ns = log.last_ns = log.header["wall_ns"]
    _Builder(log).feed(lines)
    if log.closed_reason is None:
        log.problems.append(path.name + UNCLOSED)
    return log


def read_header(path: str | Path, limit: int = 1 << 16) -> dict[str, Any] | None:
    """The checked header of an event log (its first line), or None when the file is not one (yet): what
    `record` needs to find a rank's process (``host``, ``pid``) without reading a whole log."""
    if regular_file_problem(Path(path)) is not None:
        return None
    try:
        with open(path, "rb") as f:
            first = f.readline(limit)
        header = orjson.loads(first)
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        return None
    return _checked_header(header)


def last_heartbeat(path: str | Path) -> tuple[int | None, bool]:
    """The time of the last heartbeat (``h`` record) of an event log still being written, and whether recording
    was turned off on its rank (then heartbeats stop while the rank trains): found in the file's mapping
    without parsing the log, which may be large. What `record` checks of a rank that did not answer a stall."""
    if regular_file_problem(Path(path)) is not None:
        return None, False
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            off = m.rfind(b'\n["h",')
            line = m[off + 1:m.find(b"\n", off + 1)] if off >= 0 else b""
            disabled = m.find(b"recording disabled") >= 0
    except (OSError, ValueError):  # gone, or empty (a mapping of nothing)
        return None, False
    try:
        record = orjson.loads(line) if line else None
    except orjson.JSONDecodeError:
        record = None
    t = record[1] if isinstance(record, list) and len(record) > 1 else None
    return (t if time_ok(t) else None), disabled


def _opt_int(v: Any) -> bool:
    return v is None or is_int(v)


def _opt_str(v: Any) -> bool:
    return v is None or isinstance(v, str)


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _any(v: Any) -> bool:
    return True


def _peer(v: Any) -> bool:  # a global rank, or [op, peer] pairs for batch_isend_irecv
    return v is None or rank_ok(v) or (isinstance(v, list) and all(isinstance(p, list) for p in v))


def _sizes(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(s, list) and all(map(count_ok, s)) for s in v)


def _strs(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _ranks(v: Any) -> bool:
    return isinstance(v, list) and len(v) <= MAX_WORLD_SIZE and all(rank_ok(r) for r in v)


def _opt_count(v: Any) -> bool:
    return v is None or count_ok(v)


def _devices(v: Any) -> bool:  # a `g` record's device -> backend map
    return isinstance(v, dict) and 0 < len(v) <= 16 and all(
        isinstance(k, str) and isinstance(x, str) and len(k) <= 32 and len(x) <= 64 for k, x in v.items())


def _offset(v: Any) -> bool:  # a clock offset or round trip in ns: either sign, at most a day
    return v is None or (is_int(v) and -MAX_OFFSET_NS <= v <= MAX_OFFSET_NS)


# The leading fields of each record kind (docs/log-format.md) and the check each must pass; extra trailing
# fields (from newer writers) are allowed.
_FIELDS: dict[str, tuple] = {
    "b": (count_ok, time_ok, _str, count_ok, _opt_count, _peer, _any, is_int, _opt_int, is_int, count_ok, is_int),
    "e": (count_ok, time_ok, _opt_int),
    "d": (count_ok, time_ok),
    "x": (count_ok, time_ok, _opt_str),
    "s": (is_int, _str),
    "a": (is_int, _sizes, _strs, _opt_count),
    "c": (is_int, _strs, _opt_str, _opt_str),
    "g": (is_int, _str, _str, _ranks, _opt_str),
    "r": (count_ok, time_ok, _str, is_int, _str),
    "q": (count_ok, time_ok),
    "m": (time_ok, _str, is_int, _str),
    "p": (count_ok, time_ok, _str),
    "o": (_offset, _offset),
    "k": (time_ok, _str, _opt_int, _opt_int, _opt_str),
    "f": (time_ok, _str, _str),
    "t": (time_ok, _str),
    "w": (opt_time_ok, _str),
    "z": (opt_time_ok, opt_time_ok, _str),
    "n": (is_int, _str),
    "u": (time_ok, _str, _str),
    "h": (time_ok,),
    "v": (count_ok,),
    "l": (count_ok, time_ok, time_ok, lambda v: isinstance(v, dict)),
}


# What a `b` record's ``sizes`` field (its 15th) holds, by op (record/ops.py writes it, docs/log-format.md).
_SPLITS_OPS = frozenset({"all_to_all_single", "all_to_all_single_autograd"})  # [in_splits, out_splits(, out_shape)]
_OBJECT_OPS = frozenset({"broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list",
                         "send_object_list", "recv_object_list"})  # [list length or null]
_SIZES_AT = 15


def _call_sizes(op: str, raw: Any, group: Group | None, shapes: list) -> tuple[Exchange | None, int | None]:
    """(exchange, objects) of a `b` record's ``sizes`` field ``raw``; ValueError naming what is wrong with it.
    ``shapes`` are the call's input shapes (its `a` record), ``group`` the group it names. Split sizes count
    dim-0 slices of the input (sent) and output (expected) tensor; null is the even split.

    >>> g = Group(0, "0", "default_pg", range(2), "gloo")
    >>> _call_sizes("all_to_all_single", [[3, 2], None, [4, 2]], g, [[5, 2]])
    (Exchange(send=(6, 4), recv=(4, 4), send_given=True, recv_given=False), None)
    >>> _call_sizes("broadcast_object_list", [3], g, [])
    (None, 3)
    >>> _call_sizes("all_to_all_single", [[3, 2, 1], None], g, [[6]])
    Traceback (most recent call last):
    ValueError: split sizes [3, 2, 1] are not one per member of its 2-rank group
    """
    if not isinstance(raw, list):
        raise ValueError(f"sizes {shown(raw)} are not a list")
    if op in _OBJECT_OPS:
        if len(raw) != 1 or not _opt_count(raw[0]):
            raise ValueError(f"object list length {shown(raw)} is not one count")
        return None, raw[0]
    if op not in _SPLITS_OPS and op != "all_to_all":
        return None, None  # a newer writer's field, whose meaning this reader does not know
    if group is None:
        raise ValueError("names an undeclared group")
    n = len(group.ranks)
    if op == "all_to_all":  # [output shapes]: one tensor to and from each peer
        outputs = raw[0] if len(raw) == 1 else None
        if not isinstance(outputs, list) or not _sizes(outputs) or len(outputs) != n or len(shapes) != n:
            raise ValueError(f"all_to_all's tensors {shown(shapes)} -> {shown(outputs)} are not one per member "
                             f"of its {n}-rank group")
        return Exchange(tuple(map(_numel, shapes)), tuple(map(_numel, outputs))), None
    if len(raw) not in (2, 3) or len(shapes) != 1 or not shapes[0]:
        raise ValueError(f"sizes {shown(raw)} of an all_to_all_single of input {shown(shapes)}")
    in_splits, out_splits = raw[0], raw[1]
    for splits in (in_splits, out_splits):
        if splits is not None and not (isinstance(splits, list) and len(splits) == n and all(map(count_ok, splits))):
            raise ValueError(f"split sizes {shown(splits)} are not one per member of its {n}-rank group")
    in_shape = shapes[0]
    if len(raw) == 3:  # the output tensor's shape (c10d's); a functional collective's is made from the splits
        out_shape = raw[2]
        if not _sizes([out_shape]) or not out_shape:
            raise ValueError(f"output shape {shown(out_shape)} is not a shape")
    else:
        out_shape = [sum(out_splits) if out_splits is not None else in_shape[0], *in_shape[1:]]
    return Exchange(_per_peer(in_splits, in_shape, n), _per_peer(out_splits, out_shape, n),
                    send_given=in_splits is not None, recv_given=out_splits is not None), None


def _per_peer(splits: list[int] | None, shape: list[int], n: int) -> tuple[int, ...] | None:
    """Elements to or from each peer of a tensor split along dim 0 by ``splits`` (None: evenly, where n
    divides it; else None)."""
    row = _numel(shape[1:])
    if splits is None:
        if shape[0] % n:
            return None
        splits = [shape[0] // n] * n
    counts = tuple(s * row for s in splits)
    return counts if all(map(count_ok, counts)) else None


def _numel(shape: list[int]) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total


_HEADER_FIELDS = {
    "host": _str, "backend": _str, "run_id": lambda v: isinstance(v, str) and len(v) <= 200, "torch": _str,
    "comm2perfetto": _str, "pid": count_ok,
    "local_rank": count_ok, "wall_ns": time_ok, "mono_ns": time_ok, "argv": _strs,
    "config": lambda v: isinstance(v, dict),
}


def _checked_header(header: dict[str, Any]) -> dict[str, Any]:
    """The header without the known fields whose value has the wrong type (rank, world size and version
    were checked by the caller); unknown fields from newer writers are kept."""
    return {k: v for k, v in header.items() if _HEADER_FIELDS.get(k, _any)(v)}


# Where each kind keeps its time (checked against the header's wall_ns when the header has one).
_TIME_AT = {"b": 2, "e": 2, "d": 2, "x": 2, "r": 2, "q": 2, "p": 2, "m": 1, "k": 1, "f": 1, "t": 1, "w": 1,
            "z": 1, "u": 1, "h": 1, "l": 2}


def _check(r: Any) -> None:
    """Raise ValueError naming the first field of record ``r`` that is not what its kind allows."""
    if not isinstance(r, list) or not r or not isinstance(r[0], str):
        raise ValueError("not a record")
    checks = _FIELDS.get(r[0])
    if checks is None:
        return
    if len(r) <= len(checks):
        raise ValueError(f"{r[0]!r} record with {len(r) - 1} fields")
    for i, (check, value) in enumerate(zip(checks, r[1:]), 1):
        if not check(value):
            raise ValueError(f"{r[0]!r} record field {i} is {shown(value)}")


class _Builder:
    def __init__(self, log: RankLog) -> None:
        self.log = log
        wall = log.header.get("wall_ns")  # when the rank started recording: every record comes after it
        self.window = (max(wall - MAX_OFFSET_NS, MIN_TIME_NS), wall + MAX_JOB_NS) if wall is not None else None
        self.strings: dict[int, str] = {}
        self.contexts: dict[int, tuple[tuple[str, ...], str | None, str | None]] = {0: ((), None, None)}
        self.arguments: dict[int, tuple[list, list, int | None, str | None]] = {}
        self.calls: dict[int, Call] = {}
        self.ranges: dict[int, Range] = {}
        self.bad_sizes = 0  # `b` records whose sizes field was dropped
        self.first_bad_sizes = ""

    def feed(self, lines: Iterable[bytes]) -> None:
        """Apply every line after the header; bad ones are counted into one note (a garbage file has
        millions), except a bad last line: the torn record of a rank that died while writing it."""
        bad, first, last_bad, index = 0, "", None, 0
        for index, line in enumerate(lines, 2):
            if not line.strip():
                continue
            last_bad = None
            try:
                if line[:1] != b"[":  # most garbage: no JSON parse, no exception object
                    raise ValueError("not a record")
                record = orjson.loads(line)
                _check(record)
                if self.window is not None:
                    self._in_window(record, self.window)
                self._apply(record)
            except (orjson.JSONDecodeError, IndexError, KeyError, TypeError, ValueError) as exc:
                bad += 1
                last_bad = type(exc).__name__
                if bad == 1:
                    detail = (type(exc).__name__ if isinstance(exc, orjson.JSONDecodeError)
                              else f"refers to undeclared id {exc}" if isinstance(exc, KeyError) else str(exc))
                    first = f"first at line {index}: {detail}"
        torn = last_bad is not None and not line.endswith(b"\n") if index else False
        if torn:
            bad -= 1
            self.log.problems.append(f"{self.log.path.name}: torn last record skipped ({last_bad})")
        if bad:
            self.log.problems.append(f"{self.log.path.name}: {bad:,} bad line{'s' if bad > 1 else ''} skipped "
                                     f"({first})")
        if self.bad_sizes:
            self.log.problems.append(f"{self.log.path.name}: the sizes of {self.bad_sizes:,} call"
                                     f"{'s' if self.bad_sizes > 1 else ''} skipped, the calls kept "
                                     f"({self.first_bad_sizes})")

    def _in_window(self, r: list, window: tuple[int, int]) -> None:
        at = _TIME_AT.get(r[0])
        if at is not None and r[at] is not None and not window[0] <= r[at] <= window[1]:
            raise ValueError(f"{r[0]!r} record's time {shown(r[at])} is not within a year of the header's wall_ns")

    def _ended(self, begin: int, r: list, table: dict | None = None) -> Any:
        """The call (or range) record ``r`` ends, unless it ends before it began."""
        if r[2] < begin:
            raise ValueError(f"{r[0]!r} record ends {begin - r[2]:,} ns before its begin")
        return (self.calls if table is None else table)[r[1]]

    def _sizes(self, call: Call, r: list) -> None:
        """Set ``call``'s exchange and objects from its `b` record's sizes, or count them as bad."""
        try:
            call.exchange, call.objects = _call_sizes(call.op, r[_SIZES_AT], self.log.groups.get(call.gid),
                                                      call.shapes)
        except ValueError as exc:
            self.bad_sizes += 1
            if self.bad_sizes == 1:
                self.first_bad_sizes = f"call {call.cid}, {call.op}: {exc}"

    def _apply(self, r: list) -> None:
        kind = r[0]
        log = self.log
        at = _TIME_AT.get(kind)
        t = r[at] if at is not None else None
        if isinstance(t, int):
            log.first_ns = t if log.first_ns is None else min(log.first_ns, t)
            log.last_ns = t if log.last_ns is None else max(log.last_ns, t)
        if kind == "b":
            nvtx, module, pass_ = self.contexts.get(r[10], ((), None, None))
            shapes, dtypes, nbytes, device = self.arguments[r[12]]
            call = Call(
                cid=r[1], t_call_ns=r[2], op=r[3], gid=r[4], seq=r[5], peer=r[6], is_async=bool(r[7]),
                tid=r[8], site=self.strings.get(r[9]), nvtx=nvtx, module=module, pass_=pass_, step=r[11],
                shapes=shapes, dtypes=dtypes, nbytes=nbytes, functional=len(r) > 13 and bool(r[13]), device=device,
                from_cpp=len(r) > 14 and bool(r[14]),
            )
            if len(r) > _SIZES_AT:
                self._sizes(call, r)
            self.calls[call.cid] = call
            log.calls.append(call)
        elif kind == "e":
            call = self._ended(self.calls[r[1]].t_call_ns, r)
            call.t_return_ns = r[2]
            call.seq_last = r[3]
        elif kind == "d":
            self._ended(self.calls[r[1]].t_call_ns, r).t_done_ns = r[2]
        elif kind == "v":
            self.calls[r[1]].captured = True
        elif kind == "x":
            call = self._ended(self.calls[r[1]].t_call_ns, r)
            call.t_return_ns = r[2]
            call.error = r[3]
        elif kind == "s":
            self.strings[r[1]] = r[2]
        elif kind == "a":
            device = r[5] if len(r) > 5 and isinstance(r[5], str) and len(r[5]) <= 32 else None
            self.arguments[r[1]] = (r[2], r[3], r[4], device)
        elif kind == "c":
            self.contexts[r[1]] = (tuple(r[2]), r[3], r[4])
        elif kind == "g":
            if any(x >= log.world_size for x in r[4]):
                raise ValueError(f"group {r[2]!r} lists ranks outside the {log.world_size}-rank job")
            devices = r[6] if len(r) > 6 and _devices(r[6]) else None
            log.groups[r[1]] = Group(gid=r[1], name=r[2], desc=r[3], ranks=compact_ranks(r[4]), backend=r[5] or "",
                                     devices=devices)
        elif kind == "r":
            rng = Range(rid=r[1], t_begin_ns=r[2], name=r[3], tid=r[4], source=r[5],
                        domain=r[6] if len(r) > 6 and isinstance(r[6], str) else None)
            self.ranges[rng.rid] = rng
            log.ranges.append(rng)
        elif kind == "q":
            self._ended(self.ranges[r[1]].t_begin_ns, r, self.ranges).t_end_ns = r[2]
        elif kind == "m":
            log.marks.append((r[1], r[2], r[3], r[4]))
        elif kind == "p":
            log.steps.append((r[1], r[2], r[3]))
        elif kind == "o":
            log.clock_offset_ns, log.clock_rtt_ns = r[1], r[2]
        elif kind == "k":
            log.stalls.append(Stall(t_ns=r[1], reason=r[2], trigger_rank=r[3], cid=r[4], stacks_file=r[5]))
        elif kind == "f":
            log.fr_dumps.append((r[1], r[2], r[3]))
        elif kind == "t":
            log.profiler_traces.append((r[1], r[2]))
        elif kind == "w":
            log.warnings.append((r[1], r[2]))
        elif kind == "n":
            log.thread_names[r[1]] = r[2]
        elif kind == "z":
            log.closed_reason = r[3]
        elif kind == "u":
            log.endings.append(Ending(t_ns=r[1], cause=r[2], detail=r[3]))
        elif kind == "h":
            log.heartbeats += 1
        elif kind == "l":
            log.windows.append(_window_summary(r))
        # Unknown kinds come from newer writers: ignored on purpose.


MAX_WINDOW_GROUPS = 64
MAX_WINDOW_OPS = 32
MAX_WINDOW_ARRIVALS = 4096


def _window_summary(r: list) -> WindowSummary:
    """An ``l`` record's summary, every field checked (ValueError naming the first that is not what
    docs/log-format.md says)::

        ["l", 359181722, 1795908611820665957, 1795908614999925456, {"steps": 6, "step_ns": 512000000,
         "exposed_ns": 314809424, "groups": {"0": {"issued": 71, "stride": 1,
            "ops": {"all_reduce": {"n": 56, "bytes": 224000, "time_ns": 314809424, "timed": 56}},
            "seqs": [1, 2], "arrivals_us": [53518, 128019]}}}]
    """
    window, t0, t1, raw = r[1], r[2], r[3], r[4]
    if t1 < t0:
        raise ValueError(f"'l' record ends {t0 - t1:,} ns before it begins")
    span_us = (t1 - t0) // 1000 + 1
    steps, step_ns, exposed = raw.get("steps"), raw.get("step_ns"), raw.get("exposed_ns")
    if not count_ok(steps) or not _opt_count(step_ns) or not _opt_count(exposed):
        raise ValueError(f"'l' record's steps, step_ns or exposed_ns {shown([steps, step_ns, exposed])}")
    raw_groups = raw.get("groups")
    if not isinstance(raw_groups, dict) or len(raw_groups) > MAX_WINDOW_GROUPS:
        raise ValueError(f"'l' record's groups {shown(raw_groups)}")
    groups = {}
    for name, g in raw_groups.items():
        if not isinstance(g, dict) or not _opt_count(g.get("issued")) or not isinstance(g.get("ops"), dict) \
                or len(g["ops"]) > MAX_WINDOW_OPS:
            raise ValueError(f"'l' record's group {shown(name)}: {shown(g)}")
        ops = {}
        for op, sums in g["ops"].items():
            if not (isinstance(sums, dict) and count_ok(sums.get("n")) and _opt_count(sums.get("bytes"))
                    and count_ok(sums.get("time_ns")) and count_ok(sums.get("timed")) and sums["timed"] <= sums["n"]):
                raise ValueError(f"'l' record's {shown(op)} on group {shown(name)}: {shown(sums)}")
            ops[op] = WindowOp(sums["n"], sums.get("bytes"), sums["time_ns"], sums["timed"])
        seqs, arrivals = g.get("seqs") or [], g.get("arrivals_us") or []
        if not (isinstance(seqs, list) and isinstance(arrivals, list) and len(seqs) == len(arrivals)
                <= MAX_WINDOW_ARRIVALS and all(map(count_ok, seqs))
                and all(is_int(a) and 0 <= a <= span_us for a in arrivals)):
            raise ValueError(f"'l' record's arrivals on group {shown(name)} are not one time in the window per seq")
        groups[name] = WindowGroup(g["issued"] if "issued" in g else None, ops, tuple(seqs), tuple(arrivals))
    return WindowSummary(window=window, t0_ns=t0, t1_ns=t1, steps=steps, step_ns=step_ns, exposed_ns=exposed,
                         groups=groups)

