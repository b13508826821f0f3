"""Reader for the recorder's per-rank event log (docs/log-format.md). Never imports torch.

Raw input, one JSON document per line::

    {"kind":"header","format":"comm2perfetto-events","version":1,"rank":0,"world_size":2,...}
    ["g",0,"0","default_pg",[0,1],"gloo"]
    ["a",1,[[4]],["Float"],16]
    ["b",7,1795313447406614332,"all_reduce",0,5,null,false,1396872,1,1,3,1]
    ["e",7,1795313447406980001,5]

A log cut short by a dead process ends in NUL padding and maybe one torn line: both are tolerated and
reported in ``RankLog.problems``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

FORMAT_NAME = "comm2perfetto-events"
SUPPORTED_VERSIONS = (1,)


class EventLogError(ValueError):
    """The file is not a readable comm2perfetto event log."""


@dataclass
class Group:
    gid: int
    name: str
    desc: str
    ranks: list[int]
    backend: str


@dataclass
class Call:
    """One ``torch.distributed`` call as the patch layer saw it. Times in ns; None when unknown.

    ``functional``: a functional collective (``torch.distributed._functional_collectives``, what DTensor and
    tensor parallelism use): it returns at once with a tensor to wait on, so ``t_done_ns`` stays None.
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
    captured: bool = False  # captured into a CUDA graph: issued at each replay, which no source sees

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
    closed_reason: str | None = None
    problems: list[str] = field(default_factory=list)

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


def read_event_log(path: str | Path) -> RankLog:
    """Parse one rank's event log. Raises EventLogError when the file is not one."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise EventLogError(f"{path}: cannot read ({exc.strerror})") from exc
    data = data.rstrip(b"\0")
    lines = data.split(b"\n")
    if not lines or not lines[0].strip():
        raise EventLogError(f"{path}: empty file, not a comm2perfetto event log")
    try:
        header = orjson.loads(lines[0])
    except orjson.JSONDecodeError as exc:
        raise EventLogError(f"{path}: first line is not JSON, not a comm2perfetto event log") from exc
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise EventLogError(f"{path}: no comm2perfetto event log header")
    version = header.get("version")
    if version not in SUPPORTED_VERSIONS:
        if isinstance(version, int) and version > max(SUPPORTED_VERSIONS):
            raise EventLogError(f"{path}: event log version {version} is newer than this reader "
                                f"(supports {SUPPORTED_VERSIONS}); upgrade comm2perfetto")
        raise EventLogError(f"{path}: unsupported event log version {version!r} (supports {SUPPORTED_VERSIONS})")
    log = RankLog(path=path, header=header)
    _Builder(log).feed(lines[1:])
    if log.closed_reason is None:
        log.problems.append(f"{path.name}: not closed cleanly (the rank died, or still runs): "
                            f"read up to its last record")
    return log


class _Builder:
    def __init__(self, log: RankLog) -> None:
        self.log = log
        self.strings: dict[int, str] = {}
        self.contexts: dict[int, tuple[tuple[str, ...], str | None, str | None]] = {0: ((), None, None)}
        self.arguments: dict[int, tuple[list, list, int | None]] = {}
        self.calls: dict[int, Call] = {}
        self.ranges: dict[int, Range] = {}

    def feed(self, lines: list[bytes]) -> None:
        last = len(lines) - 1
        for index, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
                self._apply(record)
            except (orjson.JSONDecodeError, IndexError, KeyError, TypeError, ValueError) as exc:
                where = "torn last record" if index == last else f"bad record on line {index + 2}"
                self.log.problems.append(f"{self.log.path.name}: {where} skipped ({type(exc).__name__})")

    def _apply(self, r: list) -> None:
        kind = r[0]
        log = self.log
        if kind == "b":
            nvtx, module, pass_ = self.contexts.get(r[10], ((), None, None))
            shapes, dtypes, nbytes = self.arguments[r[12]]
            call = Call(
                cid=r[1], t_call_ns=r[2], op=r[3], gid=r[4], seq=r[5], peer=r[6], is_async=bool(r[7]),
                tid=r[8], site=self.strings.get(r[9]), nvtx=nvtx, module=module, pass_=pass_, step=r[11],
                shapes=shapes, dtypes=dtypes, nbytes=nbytes, functional=len(r) > 13 and bool(r[13]),
            )
            self.calls[call.cid] = call
            log.calls.append(call)
        elif kind == "e":
            call = self.calls[r[1]]
            call.t_return_ns = r[2]
            call.seq_last = r[3]
        elif kind == "d":
            self.calls[r[1]].t_done_ns = r[2]
        elif kind == "v":
            self.calls[r[1]].captured = True
        elif kind == "x":
            call = self.calls[r[1]]
            call.t_return_ns = r[2]
            call.error = r[3]
        elif kind == "s":
            self.strings[r[1]] = r[2]
        elif kind == "a":
            self.arguments[r[1]] = (r[2], r[3], r[4])
        elif kind == "c":
            self.contexts[r[1]] = (tuple(r[2]), r[3], r[4])
        elif kind == "g":
            log.groups[r[1]] = Group(gid=r[1], name=r[2], desc=r[3], ranks=list(r[4]), backend=r[5])
        elif kind == "r":
            rng = Range(rid=r[1], t_begin_ns=r[2], name=r[3], tid=r[4], source=r[5],
                        domain=r[6] if len(r) > 6 and isinstance(r[6], str) else None)
            self.ranges[rng.rid] = rng
            log.ranges.append(rng)
        elif kind == "q":
            self.ranges[r[1]].t_end_ns = r[2]
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
        elif kind == "z":
            log.closed_reason = r[3]
        # Unknown kinds come from newer writers: ignored on purpose.


def read_stacks(path: str | Path) -> dict[str, Any]:
    """Read a ``rank<R>.stacks.<n>.json`` file written at a stall."""
    path = Path(path)
    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise EventLogError(f"{path}: not a readable stacks file ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != "comm2perfetto-stacks":
        raise EventLogError(f"{path}: not a comm2perfetto stacks file")
    return doc
