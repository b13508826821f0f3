"""Reader for torch.profiler (Kineto) traces, ``.json`` or ``.json.gz``. Never imports torch.

Raw input (only the parts read here)::

    {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 2,
                                             "pg_count": 1, "pg_config": [...]},
     "baseTimeNanoseconds": 1795313440000000000,
     "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 42, "tid": 42,
                      "ts": 12.5, "dur": 80.0, "args": {...}},
                     {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                      "ts": 20.0, "dur": 50.0, "args": {"Collective name": "allreduce", "Seq": 5,
                      "Process Group Name": "0", "In msg nelems": 4, "Group size": 2}}]}

Absolute time of an event = ``baseTimeNanoseconds + ts * 1000`` (``ts`` is in microseconds).
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

_COMM_NAME = re.compile(r"^(nccl|gloo|c10d::|record_param_comms)|ncclDevKernel|ncclKernel", re.IGNORECASE)


class KinetoFormatError(ValueError):
    """The file is not a readable Kineto trace."""


@dataclass(frozen=True, slots=True)
class KinetoCommEvent:
    name: str
    t_begin_ns: int
    duration_ns: int
    pid: Any
    tid: Any
    category: str
    collective: str | None
    seq: int | None
    pg_name: str | None


@dataclass(frozen=True, slots=True)
class KinetoTrace:
    path: Path
    rank: int | None
    world_size: int | None
    backend: str | None
    base_time_ns: int
    pg_config: Any
    comm_events: tuple[KinetoCommEvent, ...]
    event_count: int


def sniff_kineto(head: bytes) -> bool:
    """True when the first bytes (decompressed) look like a Chrome/Kineto trace."""
    text = head[:65536]
    return text.lstrip().startswith(b"{") and (b'"traceEvents"' in text or b'"distributedInfo"' in text
                                               or b'"schemaVersion"' in text)


def gunzip_head(data: bytes, size: int = 65536) -> bytes:
    """The first ``size`` bytes of a gzip stream, without inflating the whole file."""
    try:
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, size)
    except zlib.error:
        return b""


def read_kineto(path: str | Path, data: bytes | None = None) -> KinetoTrace:
    """Parse a Kineto trace. Raises KinetoFormatError."""
    path = Path(path)
    try:
        raw = path.read_bytes() if data is None else data
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        doc = orjson.loads(raw)
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile, orjson.JSONDecodeError) as exc:
        raise KinetoFormatError(f"{path}: not a readable Kineto trace ({type(exc).__name__})") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise KinetoFormatError(f"{path}: not a Kineto trace (no traceEvents)")
    info = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    base = int(doc.get("baseTimeNanoseconds") or 0)
    comm: list[KinetoCommEvent] = []
    for ev in doc["traceEvents"]:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        name = ev.get("name") or ""
        if not _COMM_NAME.search(name):
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        seq = args.get("Seq")
        comm.append(KinetoCommEvent(
            name=name, t_begin_ns=base + int(float(ev.get("ts", 0)) * 1000),
            duration_ns=int(float(ev.get("dur", 0)) * 1000), pid=ev.get("pid"), tid=ev.get("tid"),
            category=str(ev.get("cat", "")), collective=args.get("Collective name"),
            seq=int(seq) if isinstance(seq, (int, str)) and str(seq).isdigit() else None,
            pg_name=args.get("Process Group Name"),
        ))
    rank, world = info.get("rank"), info.get("world_size")
    return KinetoTrace(
        path=path, rank=int(rank) if isinstance(rank, int) else None,
        world_size=int(world) if isinstance(world, int) else None, backend=info.get("backend"),
        base_time_ns=base, pg_config=info.get("pg_config"), comm_events=tuple(comm),
        event_count=len(doc["traceEvents"]),
    )
