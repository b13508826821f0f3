"""Reader for PyTorch Flight Recorder (FR) dumps: pickle or JSON, every format version. Never imports torch.

Raw input (format 2.10, pickle; JSON differs as noted)::

    {'version': '2.10', 'comm_lib_version': '2.21.5',        # 'nccl_version' in 2.6-2.9, absent before
     'pg_config': {'0': {'name': '0', 'desc': 'default_pg', 'ranks': '[0, 1]'}},   # ranks is a string
     'pg_status': {'0': {'last_enqueued_collective': 5, 'last_started_collective': -1,
                         'last_completed_collective': 5}},   # JSON: values are strings
     'entries': [{'record_id': 0, 'pg_id': 0, 'process_group': ('0', 'default_pg'),   # JSON: a list
                  'collective_seq_id': 1, 'p2p_seq_id': 0, 'op_id': 1,
                  'profiling_name': 'nccl:all_reduce', 'time_created_ns': 1795313447406614332,
                  'input_sizes': [[4]], 'input_dtypes': ['Float'], 'output_sizes': [[4]],
                  'output_dtypes': ['Float'], 'state': 'completed',
                  'time_discovered_started_ns': None, 'time_discovered_completed_ns': None,  # JSON: 0
                  'retired': True, 'timeout_ms': 600000, 'is_p2p': False, 'duration_ms': 0.25,
                  'frames': [{'name': 'all_reduce', 'filename': '.../distributed_c10d.py', 'line': 3245}],
                  'thread_id': '1396...', 'thread_name': 'pt_main_thread'}]}

Older dumps lack keys (no version/dtypes/is_p2p/process_group; ``seq_id`` instead of
``collective_seq_id``); the very first ones are a bare list of entries. Gloo dumps keep every entry
``scheduled`` (so their state means "unknown") and may carry a ``pg_config`` keyed by an empty name.

This module parses files; ``ingest.py`` turns a rank's entries into columns (``FrRankTrace``) and
``tables.py`` interns their stacks and signatures.
"""

from __future__ import annotations

import ast
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

import orjson

from comm2perfetto.errors import Comm2PerfettoError
from comm2perfetto.model import Stack
from comm2perfetto.sources.fr.tables import StackTable, stack_id
from comm2perfetto.sources.limits import (
    MAX_WORLD_SIZE,
    Ranks,
    TooLargeError,
    compact_ranks,
    is_int,
    rank_ok,
    read_bounded,
    shown,
)
from comm2perfetto.sources.safe_pickle import UnsafePickleError, looks_like_pickle, safe_loads

__all__ = ["CollectiveStacks", "FrDump", "FrFormatError", "PgConfig", "rank_from_name", "read_fr_dump",
           "split_profiling_name"]

P2P_OPS = frozenset({"send", "recv"})
_P2P_NAME = re.compile(r"^(send|recv)\s+(\d+)\s*(->|<-)\s*(\d+)$")


class FrFormatError(Comm2PerfettoError, ValueError):
    """The file is not a readable Flight Recorder dump."""


@dataclass(frozen=True, slots=True)
class PgConfig:
    name: str
    desc: str
    ranks: Ranks | None  # None when the dump does not say (gloo's empty entry)


@dataclass(slots=True)
class FrDump:
    """One dump file, parsed but not yet normalised. ``entries`` are the raw dicts."""

    path: Path
    fmt: str  # "pickle" or "json"
    version: str  # "" for the early bare-list dumps
    comm_lib_version: str
    pg_config: dict[str, PgConfig]
    pg_status: dict[int, tuple[int, int, int]]  # pg_id -> (last enqueued, started, completed)
    entries: list[dict[str, Any]]
    problems: list[str] = field(default_factory=list)  # what was dropped while reading, one line per kind
    # NCCL's own state of each communicator (``nccl_comm_state``, NCCLX builds): comm -> key -> value, as written
    comm_state: dict[str, dict[str, str]] = field(default_factory=dict)


def read_fr_dump(path: str | Path, data: bytes | None = None) -> FrDump:
    """Parse one dump from its bytes (read from ``path``, gunzipped, within ``limits.MAX_FILE_BYTES``, when
    not given). Raises FrFormatError."""
    path = Path(path)
    if data is None:
        try:
            data = read_bounded(path)
        except OSError as exc:
            raise FrFormatError(f"{path}: cannot read ({exc.strerror})") from exc
        except (TooLargeError, EOFError, zlib.error) as exc:
            raise FrFormatError(f"{path}: {exc}") from exc
    if looks_like_pickle(data[:2]):
        try:
            doc = safe_loads(data)
        except UnsafePickleError as exc:
            raise FrFormatError(f"{path}: {exc}") from exc
        except Exception as exc:
            raise FrFormatError(f"{path}: corrupt or truncated pickle ({type(exc).__name__}: {exc})") from exc
        fmt = "pickle"
    else:
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise FrFormatError(f"{path}: neither a pickle nor JSON") from exc
        fmt = "json"
    return parse_fr_document(path, doc, fmt)


def parse_fr_document(path: Path, doc: Any, fmt: str) -> FrDump:
    """Validate the top level of a decoded dump (any version) and wrap it."""
    if isinstance(doc, list):  # the earliest dumps: a bare list of entries
        entries, version, top = doc, "", {}
    elif isinstance(doc, dict) and ("entries" in doc or "version" in doc):
        entries, version, top = doc.get("entries") or [], _version(doc.get("version")), doc
    else:
        raise FrFormatError(f"{path}: not a Flight Recorder dump (no 'entries' or 'version' at the top)")
    if not isinstance(entries, list):
        raise FrFormatError(f"{path}: not a Flight Recorder dump ('entries' is not a list of records)")
    problems = []
    if entries and set(map(type, entries)) != {dict}:  # one C pass; the rare bad dump pays for the filter
        kept = [e for e in entries if type(e) is dict]
        if not kept:
            raise FrFormatError(f"{path}: not a Flight Recorder dump ('entries' is not a list of records)")
        problems.append(f"{path.name}: {len(entries) - len(kept):,} Flight Recorder entries that are not "
                        "records skipped")
        entries = kept
    if entries and "profiling_name" not in entries[0]:
        raise FrFormatError(f"{path}: not a Flight Recorder dump (entries have no 'profiling_name')")
    for key in ("version", "comm_lib_version", "nccl_version"):
        if top.get(key) is not None and not _version(top[key]) and top[key] != "":
            problems.append(f"{path.name}: {key} is {shown(top[key])}, not a version; read as unknown")
    pg_config = _parse_pg_config(top.get("pg_config"), path, problems)
    return FrDump(
        path=path, fmt=fmt, version=version,
        comm_lib_version=_version(top.get("comm_lib_version")) or _version(top.get("nccl_version")),
        pg_config=pg_config, pg_status=_parse_pg_status(top.get("pg_status"), path, problems), entries=entries,
        problems=problems, comm_state=_parse_comm_state(top.get("nccl_comm_state"), path, problems),
    )


def _version(value: Any) -> str:
    """A format or library version as the dump writes it ("2.10", "2.21.5"); empty where absent or not one."""
    return value if isinstance(value, str) and _VERSION.fullmatch(value) else ""


_VERSION = re.compile(r"\d{1,9}(\.\d{1,9}){0,5}[\w.+-]{0,40}")  # 2.10, 2.21.5, 2.27.3+cuda12.8


def _label(value: Any) -> str:
    """A name or version as text: strings as they are, small ints spelled out, anything else empty."""
    if isinstance(value, str):
        return value
    return str(value) if type(value) is int and abs(value) < 1 << 63 else ""


def _parse_pg_config(raw: Any, path: Path, problems: list[str]) -> dict[str, PgConfig]:
    out: dict[str, PgConfig] = {}
    if not isinstance(raw, dict):
        if raw is not None:
            problems.append(f"{path.name}: pg_config is {shown(raw)}, not a table of groups; no group's members "
                            "are taken from it")
        return out
    for key, cfg in raw.items():
        if not isinstance(cfg, dict):
            problems.append(f"{path.name}: pg_config of group {shown(key)} is {shown(cfg)}, not a group's "
                            "description; its members are not taken from it")
            continue
        name = _label(cfg.get("name", key))
        ranks: Any = cfg.get("ranks")
        if isinstance(ranks, str):  # FR writes the list as a string, "[0, 1]"
            ranks = _rank_list(ranks)
        elif isinstance(ranks, (list, tuple)):
            ranks = checked_ranks(ranks)
        if isinstance(ranks, (tuple, range)) and ranks:
            out[name] = PgConfig(name=name, desc=_label(cfg.get("desc", "")), ranks=ranks)
        elif name:
            if cfg.get("ranks") not in (None, "", "[]") and ranks is None:
                problems.append(f"{path.name}: group {shown(name)} lists its ranks as something other than up to "
                                f"{MAX_WORLD_SIZE:,} distinct ranks; its members are not taken from it")
            out[name] = PgConfig(name=name, desc=_label(cfg.get("desc", "")), ranks=None)
    return out


_RANK_LISTS: dict[str, Ranks | None] = {}
_MAX_RANK_TEXT = MAX_WORLD_SIZE * 9  # "131071, " per rank at most: a longer text lists too many to accept


def _rank_list(text: str) -> Ranks | None:
    """Parse "[0, 1, 2]" into checked ranks, None when it is not a list of distinct ranks (every rank's dump
    repeats the same strings: cached)."""
    if text in _RANK_LISTS:
        return _RANK_LISTS[text]
    value: Any = None
    if len(text) <= _MAX_RANK_TEXT:
        try:
            value = orjson.loads(text)  # the usual "[0, 1]" is JSON; data only, never code
        except orjson.JSONDecodeError:
            try:
                value = ast.literal_eval(text)  # e.g. "(0, 1)"; literal_eval evaluates data only
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                value = None
    ranks = checked_ranks(value) if isinstance(value, (list, tuple)) else None
    if len(_RANK_LISTS) < 4096:
        _RANK_LISTS[text] = ranks
    return ranks


def checked_ranks(value: list | tuple) -> Ranks | None:
    """Distinct ranks, as a ``range`` where they are one (``limits.compact_ranks``); None when they are not
    distinct ranks.

    >>> checked_ranks([0, 1, 2, 3]), checked_ranks([0, 2]), checked_ranks([1, 1])
    (range(0, 4), (0, 2), None)
    """
    if len(value) > MAX_WORLD_SIZE or not all(map(rank_ok, value)):
        return None
    ranks = compact_ranks(value)
    return ranks if isinstance(ranks, range) or len(set(ranks)) == len(ranks) else None


def _status_value(st: dict[str, Any], key: str, bad: list[str]) -> int:
    """One counter of a group's ``pg_status``; -1 (none known) where absent, or where it fails its check (then
    its name and value go to ``bad``)."""
    value = st.get(key, -1)
    if isinstance(value, str) and value.lstrip("-").isdigit() and len(value) < 20:  # JSON writes strings
        value = int(value)
    if not is_int(value) or not -1 <= value < 1 << 63:
        bad.append(f"{key} is {shown(value)}")
        return -1
    return value


def _parse_pg_status(raw: Any, path: Path, problems: list[str]) -> dict[int, tuple[int, int, int]]:
    """pg_id -> (last enqueued, started, completed collective); a group whose entry fails its check is left out,
    a counter that fails its check reads as -1 (none known); each named in ``problems``."""
    out: dict[int, tuple[int, int, int]] = {}
    if not isinstance(raw, dict):
        if raw is not None:
            problems.append(f"{path.name}: pg_status is {shown(raw)}, not a table of groups; no collective is "
                            "known completed from it")
        return out
    bad: list[str] = []
    for key, st in raw.items():
        pg_id = int(key) if isinstance(key, (int, str)) and str(key).isdigit() and len(str(key)) < 20 else -1
        if pg_id < 0 or not isinstance(st, dict):
            bad.append(f"group {shown(key)}: {shown(st)}")
            continue
        counters = [_status_value(st, key, bad) for key in _STATUS_KEYS]
        out[pg_id] = (counters[0], counters[1], counters[2])
    if bad:
        problems.append(f"{path.name}: pg_status: {'; '.join(bad[:3])}{'; ...' if len(bad) > 3 else ''}, not "
                        "what Flight Recorder writes; read as unknown")
    return out


def _parse_comm_state(raw: Any, path: Path, problems: list[str]) -> dict[str, dict[str, str]]:
    """``nccl_comm_state``: NCCL's dump of each communicator (torch built with NCCLX writes it), strings by
    strings per communicator::

        'nccl_comm_state': {'0x5a3f...': {'commHash': '0x5a3f...', 'rank': '1', 'nRanks': '8',
                                          'CT_pendingColls': '[...]'}}

    Kept as written, every key and value at most ``_COMM_STATE_CHARS`` characters (longer ones cut, with
    ``...``); a communicator that is not a table of strings is left out and named in ``problems``.
    """
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(f"{path.name}: nccl_comm_state is {shown(raw)}, not a table of communicators; left out")
        return {}
    out: dict[str, dict[str, str]] = {}
    bad = [shown(comm) for comm, state in raw.items()
           if not isinstance(comm, str) or not isinstance(state, dict)
           or not all(isinstance(k, str) and isinstance(v, str) for k, v in state.items())]
    for comm, state in raw.items():
        if shown(comm) not in bad:
            out[_cut(comm)] = {_cut(k): _cut(v) for k, v in state.items()}
    if bad:
        problems.append(f"{path.name}: nccl_comm_state of {', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''} "
                        "is not a table of strings; left out")
    return out


_COMM_STATE_CHARS = 200


def _cut(text: str) -> str:
    return text if len(text) <= _COMM_STATE_CHARS else text[:_COMM_STATE_CHARS - 3] + "..."


_STATUS_KEYS = ("last_enqueued_collective", "last_started_collective", "last_completed_collective")


# --- names -----------------------------------------------------------------------------------------------

_RECORDER_NAME = re.compile(r"rank(\d+)\.fr(?:-[a-z]+)?\.\d+\.(?:pkl|json)$")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_TRAILING_INT = re.compile(r"(\d+)$")
_EXTENSIONS = (".pkl", ".pickle", ".json", ".gz", ".bin", ".dump")


def rank_from_name(name: str) -> int | None:
    """The global rank a dump file's name gives: ``rank5.fr.2.pkl``, ``nccl_trace_rank_5``,
    ``comm_lib_trace_rank_5``, ``rank5.pkl``, ``nccl_trace_rank_container-node02_5`` all give 5.

    FR dumps do not hold their rank, so the name is the only source (torch's writer appends it); the caller
    checks the number against the world size.
    """
    m = _RECORDER_NAME.search(name)
    if m:
        return int(m.group(1))
    stem = name
    changed = True
    while changed:
        changed = False
        for ext in _EXTENSIONS:
            if stem.lower().endswith(ext):
                stem, changed = stem[: -len(ext)], True
    m = _TRAILING_INT.search(stem)
    if m:
        return int(m.group(1))
    found = _RANK_IN_NAME.findall(stem)
    return int(found[-1]) if found else None


# --- normalisation ---------------------------------------------------------------------------------------


def split_profiling_name(name: str) -> tuple[str, str, int | None, int | None]:
    """``nccl:send 1->0`` -> (``nccl``, ``send``, src 1, dst 0); ``gloo:all_reduce`` -> (gloo, all_reduce)."""
    backend, _, rest = name.partition(":")
    if not rest:
        backend, rest = "", name
    m = _P2P_NAME.match(rest)
    if m:
        kind, a, arrow, b = m.group(1), int(m.group(2)), m.group(3), int(m.group(4))
        src, dst = (a, b) if arrow == "->" else (b, a)
        return backend, kind, src, dst
    return backend, rest.split(" ")[0], None, None


class CollectiveStacks:
    """One rank's call stacks in its dumps, found when asked: ``get((group name, collective seq))``, or with
    ``p2p`` of its sends and recvs, ``get((group name, p2p seq))``. Used to resolve call sites on
    demand when the job was loaded without them: a rank's dumps are read once for all the collectives asked
    about, and a report asks about a handful of its thousands.

    Keeps four columns of each snapshot's entries (frames, is_p2p, process group, seq); a question finds its
    seq's rows with ``tuple.index`` (C) and converts the first valid one's frames. The latest snapshot wins; in a
    coalesced group, its first entry (the user's call). Converting every entry up front cost diagnose more than
    reading the dump (1.5 us an entry)."""

    def __init__(self, dumps: list[FrDump], stacks: StackTable, p2p: bool = False) -> None:
        key_name = "p2p_seq_id" if p2p else "collective_seq_id"
        self._snapshots = [tuple(zip(*rows)) for d in reversed(dumps)  # the latest snapshot first
                           if (rows := _stack_fields(d.entries, key_name))]
        self._stacks = stacks
        self._p2p = p2p

    def get(self, key: tuple[str, int], default: Stack = ()) -> Stack:
        name, seq = key
        for frames_col, p2p_col, pg_col, seq_col in self._snapshots:
            i = -1
            while True:
                try:
                    i = seq_col.index(seq, i + 1)
                except ValueError:
                    break
                frames, pg = frames_col[i], pg_col[i]
                if type(seq_col[i]) is not int or bool(p2p_col[i]) != self._p2p or not frames \
                        or not isinstance(frames, list):
                    continue
                if isinstance(pg, (tuple, list)) and pg and pg[0] == name:
                    return self._stacks.stacks[stack_id(frames, {}, self._stacks)]
        return default


def _stack_fields(entries: list[dict[str, Any]], key_name: str) -> Iterable[tuple[Any, Any, Any, Any]]:
    """(frames, is_p2p, process_group, seq) of every entry: read in one C call an entry where every entry has
    these keys (every format since 2.4), else one by one with the older formats' fallbacks."""
    keys = ("frames", "is_p2p", "process_group", key_name)
    if entries and all(k in entries[0] for k in keys):
        try:
            rows = list(map(itemgetter(*keys), entries))
            if all(map(itemgetter(2), rows)):  # an empty group falls back to its pg_id, as below
                return rows
        except KeyError:
            pass  # a mixed dump
    return [(e.get("frames"), e.get("is_p2p"), e.get("process_group") or (_label(e.get("pg_id", 0)), ""),
             e.get(key_name, e.get("seq_id"))) for e in entries]
