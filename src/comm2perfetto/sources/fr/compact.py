"""One rank's Flight Recorder data in the compact columnar form, on disk (``rank<R>.fr-columns``). No torch.

``comm2perfetto compact`` writes these where the dumps are (one command per node: the map runs where the data
lives), and diagnose, merge and report read them as they read dumps, without unpickling (49 bytes an
entry, a third of the benchmark's pickles, whose entries share their frames). The file is what a worker
process hands the loader (``columns.GroupTrack``), made portable::

    C2P-FR-COLUMNS 1\\n                      magic and format version
    <8 bytes: header length, little-endian>
    {"rank": 5, "files": [...], "version": "2.10", "backend": "nccl", "pg_config": [["0", "default_pg", [0, 1]]],
     "completed_upto": [["0", "default_pg", -1]], "notes": [], "conflict": null,
     "stacks": [[["train.py", 57, "step"], ...], ...],               # the rank's call stacks, innermost first
     "groups": [{"name": "0", "desc": "default_pg", "pg_ids": [0], "first_record_id": 0,
                 "sigs": [["all_reduce", [[4]], ["Float"], [[4]], ["Float"], "fr", []]],
                 "stack_table": [0, 1],                              # the group's stack ids -> "stacks"
                 "columns": {"seq": [0, 2000, "q"], "sig": [16000, 2000, "i"], ...},  # offset, length, type
                 "p2p": [["send", 1, 1, SIG, "completed", 17..., 17..., 0, 12]]}],
     "unread": [["0", 7, 7]],        # seqs of a group whose record on this rank is unknown (an entry unreadable)
     "unread_p2p": []}               # groups where a send/recv of this rank was unreadable
    <the columns' bytes, little-endian>

Read back, it is input like any dump: every field is checked (types, ranges, lengths, ids within their
tables, offsets within the file) and a file that fails is skipped and named (``FrFormatError``).
"""

from __future__ import annotations

import sys
from array import array
from math import isnan
from pathlib import Path
from typing import Any

import orjson

from comm2perfetto.model import Signature
from comm2perfetto.sources.fr.columns import COLUMNS_MAGIC as MAGIC
from comm2perfetto.sources.fr.columns import NO_VALUE, STATES, GroupTrack
from comm2perfetto.sources.fr.dump import FrFormatError, PgConfig, checked_ranks
from comm2perfetto.sources.fr.fields import MAX_DURATION_MS
from comm2perfetto.sources.fr.ingest import FrRankTrace
from comm2perfetto.sources.fr.tables import StackTable
from comm2perfetto.sources.limits import (
    MAX_FILE_BYTES,
    MIN_TIME_NS,
    TooLargeError,
    count_ok,
    is_int,
    rank_ok,
    read_bounded,
)

SUFFIX = ".fr-columns"
# column name -> (GroupTrack attribute, array type code)
_COLUMNS = {"seq": ("seq_col", "q"), "sig": ("sig_col", "i"), "state": ("state_col", "b"),
            "created": ("created_col", "q"), "started": ("started_col", "q"), "completed": ("completed_col", "q"),
            "stack": ("stack_col", "i"), "duration": ("duration_col", "d")}
_OPTIONAL = ("stack", "duration")


def file_name(rank: int) -> str:
    return f"rank{rank}{SUFFIX}"


# --- writing ---------------------------------------------------------------------------------------------


def write_fr_columns(path: Path, trace: FrRankTrace, stacks: StackTable, conflict: str | None = None) -> int:
    """Write one rank's columns (stack ids index ``stacks``); returns the bytes written."""
    used: dict[int, int] = {}  # job stack id -> id in this file
    groups = []
    blob = bytearray()
    for track in trace.groups.values():
        local = [used.setdefault(sid, len(used)) for sid in track.stack_table]
        columns: dict[str, list | None] = {}
        for name, (attr, code) in _COLUMNS.items():
            col = getattr(track, attr)
            if col is None:
                columns[name] = None
                continue
            data = _little_endian(col)
            columns[name] = [len(blob), len(col), code]
            blob += data
        p2p = [[kind, peer, p2p_seq, _sig_json(sig), state, t0, t1,
                used.setdefault(sid, len(used)) if sid is not None else None, rid]
               for kind, peer, p2p_seq, sig, state, t0, t1, sid, rid in track.p2p]
        groups.append({"name": track.name, "desc": track.desc, "pg_ids": sorted(track.pg_ids),
                       "first_record_id": track.first_record_id, "sigs": [_sig_json(s) for s in track.sig_table],
                       "stack_table": local, "columns": columns, "p2p": p2p})
    table: list[list[list[object]]] = [[] for _ in used]
    for sid, i in used.items():
        table[i] = [[f.file, f.line, f.func] for f in stacks.stacks[sid]]
    header = {
        "format": "comm2perfetto-fr-columns", "rank": trace.rank, "files": trace.files, "version": trace.version,
        "backend": trace.backend,
        "pg_config": [[c.name, c.desc, list(c.ranks) if c.ranks is not None else None]
                      for c in trace.pg_config.values()],
        "completed_upto": [[k[0], k[1], v] for k, v in trace.completed_upto.items()],
        "notes": trace.notes, "conflict": conflict, "stacks": table, "groups": groups,
        "unread": [[name, lo, hi] for name, spans in trace.unread.items() for lo, hi in spans],
        "unread_p2p": sorted(trace.unread_p2p, key=str),
    }
    head = orjson.dumps(header)
    data = MAGIC + len(head).to_bytes(8, "little") + head + bytes(blob)
    path.write_bytes(data)
    return len(data)


def _little_endian(col: array) -> bytes:
    if sys.byteorder == "little":
        return col.tobytes()
    swapped = array(col.typecode, col)
    swapped.byteswap()
    return swapped.tobytes()


def _sig_json(sig: Signature) -> list:
    return [sig.op, sig.input_sizes, sig.input_dtypes, sig.output_sizes, sig.output_dtypes, sig.source,
            [_sig_json(p) for p in sig.parts]]


# --- reading ---------------------------------------------------------------------------------------------


class _Bad(FrFormatError):
    """What is wrong with the file (raised again as FrFormatError, with the path)."""


def read_fr_columns(path: Path, stacks: StackTable) -> tuple[FrRankTrace, str | None]:
    """Read and check one columns file; its stacks are interned into ``stacks``. Raises FrFormatError."""
    try:
        data = read_bounded(path, MAX_FILE_BYTES)
    except OSError as exc:
        raise FrFormatError(f"{path}: cannot read ({exc.strerror})") from exc
    except (TooLargeError, EOFError, ValueError) as exc:
        raise FrFormatError(f"{path}: {exc}") from exc
    try:
        return _parse(path, data, stacks)
    except _Bad as exc:
        raise FrFormatError(f"{path}: not a valid comm2perfetto columns file ({exc})") from None
    except (orjson.JSONDecodeError, RecursionError) as exc:
        raise FrFormatError(f"{path}: not a valid comm2perfetto columns file ({type(exc).__name__})") from None


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise _Bad(what)


def _parse(path: Path, data: bytes, stacks: StackTable) -> tuple[FrRankTrace, str | None]:
    _need(data.startswith(MAGIC) and len(data) >= len(MAGIC) + 8, "no header")
    size = int.from_bytes(data[len(MAGIC):len(MAGIC) + 8], "little")
    start = len(MAGIC) + 8
    _need(size <= len(data) - start, "header longer than the file")
    header = orjson.loads(data[start:start + size])
    blob = memoryview(data)[start + size:]
    _need(isinstance(header, dict) and header.get("format") == "comm2perfetto-fr-columns", "not a columns header")
    rank = header.get("rank")
    _need(rank_ok(rank), f"rank {rank!r}")
    files = _strings(header.get("files"), "files")
    notes = _strings(header.get("notes"), "notes")
    version, backend = _text(header.get("version")), _text(header.get("backend"))
    conflict = header.get("conflict")
    _need(conflict is None or isinstance(conflict, str), "conflict")
    pg_config: dict[str, PgConfig] = {}
    for item in _list(header.get("pg_config"), "pg_config"):
        _need(isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) and isinstance(item[1], str),
              "pg_config entry")
        ranks = checked_ranks(item[2]) if isinstance(item[2], list) else None
        _need(item[2] is None or ranks is not None, f"ranks of group {item[0]!r}")
        pg_config[item[0]] = PgConfig(item[0], item[1], ranks)
    completed_upto: dict[tuple[str, str], int] = {}
    for item in _list(header.get("completed_upto"), "completed_upto"):
        _need(isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) and isinstance(item[1], str)
              and is_int(item[2]) and item[2] >= -1, "completed_upto entry")
        completed_upto[(item[0], item[1])] = item[2]
    unread: dict[str | None, list[tuple[int, int]]] = {}
    for item in _list(header.get("unread", []), "unread"):  # absent from files written before it existed
        _need(isinstance(item, list) and len(item) == 3 and (item[0] is None or isinstance(item[0], str))
              and count_ok(item[1]) and count_ok(item[2]) and item[1] <= item[2], "unread entry")
        unread.setdefault(item[0], []).append((item[1], item[2]))
    unread_p2p = _list(header.get("unread_p2p", []), "unread_p2p")
    _need(all(name is None or isinstance(name, str) for name in unread_p2p), "unread_p2p")
    table = [_stack(s, stacks) for s in _list(header.get("stacks"), "stacks")]
    groups: dict[tuple[str, str], GroupTrack] = {}
    for g in _list(header.get("groups"), "groups"):
        track = _group(g, blob, table)
        _need((track.name, track.desc) not in groups, f"group {track.name!r} twice")
        groups[(track.name, track.desc)] = track
    trace = FrRankTrace(rank=rank, files=files, version=version, backend=backend, pg_config=pg_config,
                        groups=groups, completed_upto=completed_upto, notes=notes,
                        unread={name: tuple(spans) for name, spans in unread.items()},
                        unread_p2p=frozenset(unread_p2p))
    return trace, conflict


def _list(value: Any, what: str) -> list:
    _need(isinstance(value, list), what)
    return value


def _strings(value: Any, what: str) -> list[str]:
    _need(isinstance(value, list) and all(isinstance(x, str) for x in value), what)
    return value


def _text(value: Any) -> str:
    _need(isinstance(value, str), "a name")
    return value


def _stack(raw: Any, stacks: StackTable) -> int:
    _need(isinstance(raw, list), "a stack")
    frames = []
    for f in raw:
        _need(isinstance(f, list) and len(f) == 3 and isinstance(f[0], str) and count_ok(f[1])
              and isinstance(f[2], str), "a frame")
        frames.append(stacks.frame(f[0], f[1], f[2]))
    return stacks.intern(tuple(frames))


def _sizes(raw: Any) -> tuple[tuple[int, ...], ...] | None:
    if raw is None:
        return None
    _need(isinstance(raw, list) and all(isinstance(s, list) and all(map(count_ok, s)) for s in raw), "sizes")
    return tuple(tuple(s) for s in raw)


def _dtypes(raw: Any) -> tuple[str, ...] | None:
    if raw is None:
        return None
    _need(isinstance(raw, list) and all(isinstance(x, str) for x in raw), "dtypes")
    return tuple(raw)


def _signature(raw: Any, depth: int = 0) -> Signature:
    _need(isinstance(raw, list) and len(raw) == 7 and isinstance(raw[0], str) and isinstance(raw[5], str)
          and isinstance(raw[6], list) and depth < 2, "a signature")
    parts = tuple(_signature(p, depth + 1) for p in raw[6])
    return Signature(raw[0], _sizes(raw[1]), _dtypes(raw[2]), _sizes(raw[3]), _dtypes(raw[4]), raw[5], parts)


def _group(g: Any, blob: memoryview, table: list[int]) -> GroupTrack:
    _need(isinstance(g, dict), "a group")
    name, desc = _text(g.get("name")), _text(g.get("desc"))
    pg_ids = _list(g.get("pg_ids"), "pg_ids")
    _need(all(map(count_ok, pg_ids)), "pg_ids")
    first = g.get("first_record_id")
    _need(is_int(first) and first >= NO_VALUE, "first_record_id")
    sigs = [_signature(s) for s in _list(g.get("sigs"), "sigs")]
    local = _list(g.get("stack_table"), "stack_table")
    _need(all(is_int(i) and 0 <= i < len(table) for i in local), "stack_table")
    track = GroupTrack(name, desc, set(pg_ids), sig_table=sigs, stack_table=[table[i] for i in local],
                       first_record_id=first)
    columns = g.get("columns")
    _need(isinstance(columns, dict), "columns")
    n = None
    for key, (attr, code) in _COLUMNS.items():
        spec = columns.get(key)
        if spec is None and key in _OPTIONAL:
            continue
        col = _column(spec, code, blob, key)
        _need(n is None or len(col) == n, f"column {key} of another length")
        n = len(col)
        setattr(track, attr, col)
    _check_values(track, len(sigs), len(local))
    for row in _list(g.get("p2p"), "p2p"):
        track.p2p.append(_p2p(row, table))
    return track


def _column(spec: Any, code: str, blob: memoryview, key: str) -> array:
    _need(isinstance(spec, list) and len(spec) == 3 and spec[2] == code and count_ok(spec[0]) and count_ok(spec[1]),
          f"column {key}")
    col = array(code)
    end = spec[0] + spec[1] * col.itemsize
    _need(end <= len(blob), f"column {key} beyond the file")
    col.frombytes(blob[spec[0]:end])
    if sys.byteorder != "little":
        col.byteswap()
    return col


def _check_values(track: GroupTrack, sigs: int, stacks: int) -> None:
    seqs = track.seq_col
    if not seqs:
        return
    _need(min(seqs) >= 0 and len(set(seqs)) == len(seqs) and sorted(seqs) == seqs.tolist(), "seqs")
    _need(0 <= min(track.sig_col) and max(track.sig_col) < sigs, "signature ids")
    _need(0 <= min(track.state_col) and max(track.state_col) < len(STATES), "states")
    for col in (track.created_col, track.started_col, track.completed_col):
        known = [t for t in col if t != NO_VALUE]
        _need(not known or min(known) >= MIN_TIME_NS, "times")
    if track.stack_col is not None:
        _need(min(track.stack_col) >= NO_VALUE and max(track.stack_col) < stacks, "stack ids")
    if track.duration_col is not None:
        known_ms = [d for d in track.duration_col if d != -1.0]
        _need(not any(map(isnan, known_ms)) and (not known_ms or (min(known_ms) >= 0
                                                                  and max(known_ms) < MAX_DURATION_MS)), "durations")


def _p2p(row: Any, table: list[int]) -> tuple:
    _need(isinstance(row, list) and len(row) == 9, "a p2p op")
    kind, peer, p2p_seq, sig, state, t0, t1, sid, rid = row
    _need(isinstance(kind, str) and (peer is None or count_ok(peer)) and (p2p_seq is None or count_ok(p2p_seq))
          and state in STATES and all(t is None or (count_ok(t) and t >= MIN_TIME_NS) for t in (t0, t1))
          and (sid is None or (is_int(sid) and 0 <= sid < len(table))) and (count_ok(rid) or rid == NO_VALUE),
          "a p2p op")
    return (kind, peer, p2p_seq, _signature(sig), state, t0, t1, table[sid] if sid is not None else None, rid)
