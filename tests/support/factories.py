"""Builders of Flight Recorder dumps and recorder logs for tests and benchmarks (no torch needed).

Dumps are written the way torch writes them: a pickle (protocol 2, like torch's C++ pickler) or JSON,
named ``<prefix><rank>``; frame dicts are shared between entries, as torch's pickler memoizes them.

    job = FrJob(world=4)                      # default group "0" of 4 ranks
    for rank in job.ranks:
        job.collective(rank, "all_reduce", [[4]])
    job.drop(rank=2, seq=3)                   # rank 2 never issued seq 3
    job.write(tmp_path)                       # nccl_trace_rank_0 ... nccl_trace_rank_3
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

T0_NS = 1_795_313_447_000_000_000
STEP_NS = 1_000_000  # 1 ms between consecutive collectives

# Torch-internal frames first (innermost first), then user frames, as FR records them.
_TORCH_FRAMES = [
    {"name": "all_reduce", "filename": "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
     "line": 3245},
    {"name": "wrapper", "filename": "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py",
     "line": 83},
]


def user_frames(site: str) -> list[dict[str, Any]]:
    """``train.py:57`` -> FR frames whose first non-torch frame is train.py:57 (function ``train``)."""
    file, line = site.split(":")
    return _TORCH_FRAMES + [
        {"name": "train", "filename": f"/home/user/proj/{file}", "line": int(line)},
        {"name": "main", "filename": "/home/user/proj/launch.py", "line": 12},
        {"name": "<module>", "filename": "/home/user/proj/launch.py", "line": 30},
    ]


@dataclass
class Group:
    name: str
    desc: str
    ranks: tuple[int, ...]


@dataclass
class FrJob:
    """A job's worth of FR entries, built rank by rank, written as one dump per rank."""

    world: int
    backend: str = "nccl"
    version: str = "2.10"
    groups: dict[str, Group] = field(default_factory=dict)
    entries: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    _seq: dict[tuple[int, str], int] = field(default_factory=dict)
    _p2p_seq: dict[tuple[int, str], int] = field(default_factory=dict)
    _op_id: dict[tuple[int, str], int] = field(default_factory=dict)
    _frames: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.groups.setdefault("0", Group("0", "default_pg", tuple(range(self.world))))
        for r in range(self.world):
            self.entries.setdefault(r, [])

    @property
    def ranks(self) -> range:
        return range(self.world)

    def group(self, name: str, ranks: list[int], desc: str = "undefined") -> None:
        self.groups[name] = Group(name, desc, tuple(ranks))

    def _frames_for(self, site: str) -> list[dict[str, Any]]:
        if site not in self._frames:
            self._frames[site] = user_frames(site)
        return self._frames[site]

    def _base(self, rank: int, pg: str, op: str, in_sizes, out_sizes, dtype: str, state: str,
              site: str, t_ns: int | None, is_p2p: bool) -> dict[str, Any]:
        key = (rank, pg)
        self._op_id[key] = self._op_id.get(key, 0) + 1
        entries = self.entries[rank]
        g = self.groups[pg]
        created = t_ns if t_ns is not None else T0_NS + len(entries) * STEP_NS + rank * 1000
        done = state == "completed"
        return {
            "frames": list(self._frames_for(site)), "record_id": len(entries), "pg_id": int(pg) if pg.isdigit() else 0,
            "process_group": (g.name, g.desc), "collective_seq_id": self._seq.get(key, 0),
            "p2p_seq_id": self._p2p_seq.get(key, 0), "op_id": self._op_id[key],
            "profiling_name": f"{self.backend}:{op}", "time_created_ns": created,
            "input_sizes": in_sizes, "input_dtypes": [dtype] * len(in_sizes),
            "output_sizes": out_sizes, "output_dtypes": [dtype] * len(out_sizes), "state": str(state),
            "time_discovered_started_ns": created + 1000 if state in ("started", "completed") else None,
            "time_discovered_completed_ns": created + 50_000 if done else None,
            "retired": done, "timeout_ms": 600000, "is_p2p": is_p2p,
            "thread_name": "pt_main_thread", "thread_id": "139687281163136",
        }

    def collective(self, rank: int, op: str, in_sizes: list, out_sizes: list | None = None, *,
                   pg: str = "0", dtype: str = "Float", state: str = "completed", site: str = "train.py:57",
                   t_ns: int | None = None, coalesced: list[tuple[str, list, list]] | None = None,
                   duration_ms: float | None = None) -> None:
        """Append one collective on ``rank`` (its seq is the next on that group). ``coalesced`` makes it a
        coalesced group: one entry per (op, in, out) then a closing ``op`` entry, all with the same seq.
        ``duration_ms``: its GPU time, as NCCL's Flight Recorder writes it with TORCH_NCCL_ENABLE_TIMING=1."""
        key = (rank, pg)
        self._seq[key] = self._seq.get(key, 0) + 1
        if coalesced:
            for sub_op, sub_in, sub_out in coalesced:
                self.entries[rank].append(self._base(rank, pg, sub_op, sub_in, sub_out, dtype, "scheduled", site,
                                                     t_ns, False))
        out = out_sizes if out_sizes is not None else in_sizes
        entry = self._base(rank, pg, op, in_sizes, out, dtype, state, site, t_ns, False)
        if duration_ms is not None:
            entry["duration_ms"] = duration_ms
        self.entries[rank].append(entry)

    def p2p(self, rank: int, kind: str, peer: int, sizes: list, *, pg: str = "0", state: str = "completed",
            site: str = "pipe.py:20", batch: bool = False) -> None:
        """One send or recv (``peer`` global). Group-rank numbering in the name, as FR writes it."""
        key = (rank, pg)
        if not batch or not self.entries[rank] or not self.entries[rank][-1]["is_p2p"]:
            self._p2p_seq[key] = self._p2p_seq.get(key, 0) + 1
        members = sorted(self.groups[pg].ranks)
        me, other = members.index(rank), members.index(peer)
        name = f"send {me}->{other}" if kind == "send" else f"recv {me}<-{other}"
        in_sizes, out_sizes = (sizes, sizes)
        self.entries[rank].append(self._base(rank, pg, name, in_sizes, out_sizes, "Float",
                                             "scheduled" if batch else state, site, None, True))

    def close_batch(self, rank: int, *, pg: str = "0", state: str = "completed") -> None:
        """The closing ``coalesced`` entry of a batch of p2p ops (carries the batch's real state)."""
        self.entries[rank].append(self._base(rank, pg, "coalesced", [], [], "Float", state, "pipe.py:20", None,
                                             True))

    def drop(self, rank: int, seq: int, pg: str = "0") -> None:
        """Remove ``rank``'s entries of ``seq`` (and renumber nothing: the rank never issued it)."""
        self.entries[rank] = [
            e for e in self.entries[rank]
            if not (e["process_group"][0] == pg and e["collective_seq_id"] == seq and not e["is_p2p"])
        ]

    def truncate(self, rank: int, after_seq: int, pg: str = "0") -> None:
        """Rank stopped after ``after_seq``: drop everything later on that group."""
        self.entries[rank] = [
            e for e in self.entries[rank]
            if not (e["process_group"][0] == pg and e["collective_seq_id"] > after_seq)
        ]

    def set_state(self, rank: int, seq: int, state: str, pg: str = "0") -> None:
        for e in self.entries[rank]:
            if e["process_group"][0] == pg and e["collective_seq_id"] == seq:
                e["state"] = str(state)  # the plain string a dump holds, whether given a model.CallState or not
                e["retired"] = state == "completed"
                if state != "completed":
                    e["time_discovered_completed_ns"] = None
                if state == "scheduled":
                    e["time_discovered_started_ns"] = None

    # --- writing -----------------------------------------------------------------------------------------

    def document(self, rank: int, fmt: str = "pickle") -> Any:
        """The dump of one rank in ``self.version``'s layout (``"list"``: the earliest bare list)."""
        entries = [self._versioned(e) for e in self.entries[rank]]
        if fmt == "json":
            for e in entries:
                e.pop("frames", None)
                e["process_group"] = list(e["process_group"])
                for k in ("time_discovered_started_ns", "time_discovered_completed_ns"):
                    if e.get(k) is None and k in e:
                        e[k] = 0
        if self.version == "list":
            return entries
        pg_config = {
            g.name: {"name": g.name, "desc": g.desc, "ranks": str(list(g.ranks))}
            for g in self.groups.values() if rank in g.ranks
        }
        if self.backend == "gloo":  # gloo's junk config (FACTS.md)
            pg_config = {"": {"name": "", "desc": "", "ranks": "[]"}}
        doc: dict[str, Any] = {"version": self.version, "pg_config": pg_config}
        v = tuple(int(x) for x in self.version.split("."))
        if v >= (2, 10):
            doc["comm_lib_version"] = "2.21.5"
        elif v >= (2, 6):
            doc["nccl_version"] = "2.21.5"
        if v >= (2, 3):
            status = {}
            for g in self.groups.values():
                seqs = [e["collective_seq_id"] for e in self.entries[rank] if e["process_group"][0] == g.name]
                done = [e["collective_seq_id"] for e in self.entries[rank]
                        if e["process_group"][0] == g.name and e["state"] == "completed"]
                last, last_done = max(seqs, default=-1), max(done, default=-1)
                val = {"last_enqueued_collective": last, "last_started_collective": last,
                       "last_completed_collective": last_done}
                status[str(int(g.name) if g.name.isdigit() else 0)] = (
                    {k: str(x) for k, x in val.items()} if fmt == "json" else val)
            doc["pg_status"] = status
        if entries or fmt == "pickle":
            doc["entries"] = entries
        return doc

    def _versioned(self, e: dict[str, Any]) -> dict[str, Any]:
        e = dict(e)
        if self.version == "list":
            e["seq_id"] = e.pop("collective_seq_id")
            for k in ("process_group", "p2p_seq_id", "op_id", "input_dtypes", "output_dtypes", "is_p2p",
                      "timeout_ms", "thread_name", "thread_id"):
                e.pop(k, None)
            return e
        v = tuple(int(x) for x in self.version.split("."))
        if v < (2, 3):
            for k in ("input_dtypes", "output_dtypes", "timeout_ms"):
                e.pop(k, None)
        if v < (2, 4):
            e.pop("is_p2p", None)
        if v < (2, 9):
            e.pop("thread_name", None)
            e.pop("thread_id", None)
        return e

    def write(self, folder: Path, prefix: str = "nccl_trace_rank_", fmt: str = "pickle",
              ranks: list[int] | None = None, names: dict[int, str] | None = None) -> list[Path]:
        folder.mkdir(parents=True, exist_ok=True)
        out = []
        for rank in ranks if ranks is not None else self.ranks:
            name = (names or {}).get(rank, f"{prefix}{rank}")
            path = folder / name
            doc = self.document(rank, fmt)
            if fmt == "json":
                path.write_text(json.dumps(doc))
            else:
                path.write_bytes(pickle.dumps(doc, protocol=2))
            out.append(path)
        return out


def steady_job(world: int, steps: int, *, backend: str = "nccl", version: str = "2.10") -> FrJob:
    """Every rank issues the same ``steps`` collectives (a rotating mix of ops), all completed."""
    job = FrJob(world=world, backend=backend, version=version)
    ops = [("all_reduce", [[1024, 1024]], None), ("all_gather", [[256]], [[256 * world]]),
           ("_reduce_scatter_base", [[64 * world]], [[64]]), ("broadcast", [[32, 32]], None)]
    for i in range(steps):
        op, ins, outs = ops[i % len(ops)]
        for r in job.ranks:
            job.collective(r, op, ins, outs, site=f"train.py:{50 + i % len(ops)}")
    return job


# --- recorder event logs (docs/log-format.md) ------------------------------------------------------------


@dataclass
class EventLog:
    """A minimal recorder event log for one rank, written line by line as the recorder does."""

    rank: int
    world: int
    backend: str = "gloo"
    offset_ns: int = 0
    lines: list[Any] = field(default_factory=list)
    _cid: int = 0
    _sites: dict[str, int] = field(default_factory=dict)
    _args: dict[str, int] = field(default_factory=dict)
    _contexts: dict[str, int] = field(default_factory=dict)
    _rid: int = 0

    def __post_init__(self) -> None:
        self.lines.append({"kind": "header", "format": "comm2perfetto-events", "version": 1, "rank": self.rank,
                           "world_size": self.world, "local_rank": self.rank, "host": "node01",
                           "pid": 4000 + self.rank, "torch": "2.13.0+cpu", "backend": self.backend,
                           "comm2perfetto": "0.1.0", "run_id": "run-1", "wall_ns": T0_NS, "mono_ns": 1,
                           "argv": ["train.py"], "config": {}})
        self.lines.append(["c", 0, [], None, None])
        self.lines.append(["o", self.offset_ns, 2000 if self.rank else 0])

    def group(self, gid: int, name: str, desc: str, ranks: list[int]) -> None:
        self.lines.append(["g", gid, name, desc, ranks, self.backend])

    def call(self, op: str, t_ns: int, *, gid: int = 0, seq: int | None = None, seq_last: int | None = None,
             peer: Any = None, shapes: list | None = None, dtypes: list | None = None, dur_ns: int = 50_000,
             site: str = "train.py:57 train", returns: bool = True, is_async: bool = False,
             error: str | None = None, done_ns: int | None = None, module: str | None = None,
             pass_: str | None = None, nbytes: int | None = None, step: int = 1, sizes: Any = None) -> int:
        """One recorded call; ``done_ns``: when an async call's work completed; ``module``/``pass_``: the
        module it was issued in; ``sizes``: the `b` record's sizes field (an all-to-all's splits, an object
        collective's list length), written where not None."""
        self._cid += 1
        cid = self._cid
        context = 0
        if module is not None or pass_ is not None:
            context = self._context(module, pass_)
        if site not in self._sites:
            self._sites[site] = len(self._sites) + 1
            self.lines.append(["s", self._sites[site], site])
        key = json.dumps([shapes, dtypes, nbytes])
        if key not in self._args:
            self._args[key] = len(self._args) + 1
            self.lines.append(["a", self._args[key], shapes if shapes is not None else [],
                               dtypes if dtypes is not None else [], nbytes])
        self.lines.append(["b", cid, t_ns, op, gid, seq, peer, is_async, 1396872, self._sites[site], context,
                           step, self._args[key], *([0, 0, sizes] if sizes is not None else [])])
        if error is not None:
            self.lines.append(["x", cid, t_ns + dur_ns, error])
        elif returns:
            self.lines.append(["e", cid, t_ns + dur_ns, seq_last if seq_last is not None else seq])
        if done_ns is not None:
            self.lines.append(["d", cid, done_ns])
        return cid

    def _context(self, module: str | None, pass_: str | None) -> int:
        key = json.dumps([module, pass_])
        if key not in self._contexts:
            self._contexts[key] = len(self._contexts) + 1
            self.lines.append(["c", self._contexts[key], [], module, pass_])
        return self._contexts[key]

    def range(self, name: str, begin_ns: int, end_ns: int | None, *, tid: int = 1396872,
              source: str = "range") -> None:
        """An NVTX / comm2perfetto.range() range; ``end_ns=None``: never closed."""
        self._rid += 1
        self.lines.append(["r", self._rid, begin_ns, name, tid, source])
        if end_ns is not None:
            self.lines.append(["q", self._rid, end_ns])

    def step(self, n: int, t_ns: int, source: str = "optimizer") -> None:
        """The step counter became ``n`` at ``t_ns``."""
        self.lines.append(["p", n, t_ns, source])

    def stall(self, t_ns: int, reason: str = "pending", trigger_rank: int = 0, cid: int | None = None,
              stacks_file: str | None = None) -> None:
        self.lines.append(["k", t_ns, reason, trigger_rank, cid, stacks_file])

    def close(self, t_ns: int, reason: str = "exit") -> None:
        self.lines.append(["z", t_ns, 2, reason])

    def ending(self, t_ns: int, cause: str, detail: str) -> None:
        """A ``u`` record: a signal (``SIGINT``) or an uncaught exception (``ValueError: bad``) ends the process."""
        self.lines.append(["u", t_ns, cause, detail])

    def heartbeats(self, until_ns: int, every_ns: int = 10**9) -> None:
        """``h`` records from the start to ``until_ns``."""
        self.lines.extend(["h", t] for t in range(T0_NS, until_ns + 1, every_ns))

    def write(self, folder: Path, crashed: bool = False) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rank{self.rank}.events.jsonl"
        text = "\n".join(json.dumps(x, separators=(",", ":")) for x in self.lines) + "\n"
        data = text.encode()
        if crashed:  # a dead process leaves the mapping's zero padding
            data += b"\0" * 4096
        path.write_bytes(data)
        return path


def stacks_file(folder: Path, rank: int, frames: list[tuple[str, int, str]], t_ns: int, n: int = 1,
                pending: list[dict] | None = None) -> Path:
    """A ``rank<R>.stacks.<n>.json`` with one main thread whose frames are (file, line, func), innermost first."""
    doc = {"format": "comm2perfetto-stacks", "version": 1, "rank": rank, "t_ns": t_ns, "reason": "remote",
           "trigger_rank": 0, "pending": pending or [],
           "threads": [{"tid": 1396872, "name": "MainThread",
                        "frames": [{"file": f, "line": ln, "func": fn} for f, ln, fn in frames]}]}
    path = folder / f"rank{rank}.stacks.{n}.json"
    path.write_text(json.dumps(doc))
    return path
