#!/usr/bin/env python3
"""The GPU check's driver (tests/gpu/device_check.sh runs it): real NCCL recordings, their checks, the costs,
and the fixtures and summary that come back from the device machine.

    python tests/gpu/device_check.py record-all   # recordings of tests/gpu/jobs/*.py, diagnose/report/merge, checks
    python tests/gpu/device_check.py costs        # tests/gpu/jobs/costs.py: per-call, dump and NCCL timing costs
    python tests/gpu/device_check.py pytest-figures LOG   # pass/fail counts and figures from tests/gpu's log
    python tests/gpu/device_check.py pack         # $OUT/fixtures.tgz, $OUT/summary.txt, $OUT/results.json

Environment: ``C2P_WORK`` (the work folder: recordings, logs, results.json), ``OUT`` (what comes back),
``C2P_GPU_CHECK_CPU=1`` (no GPU: the same jobs on gloo, GPU-only checks SKIP). Every check prints one line,
``PASS``/``FAIL``/``SKIP``/``INFO``, and lands in ``results.json``. Imports no torch (the readers do not need it).

The checks are issue 26's item 2 (checked against the hardware): completion of async NCCL work only from
Flight Recorder's state; ``duration_ms`` with timing on, none with ``--no-gpu-timing``, and used for bandwidth;
the stall detected per counter and diagnosed; the CUDA profiler trace merged (kernels, streams, GPU-true steps,
collective durations); nothing touched during a CUDA graph capture.
"""

from __future__ import annotations

import glob
import gzip
import itertools
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "tests" / "gpu" / "jobs"
PY = sys.executable
CPU = os.environ.get("C2P_GPU_CHECK_CPU") == "1"
WORK = Path(os.environ.get("C2P_WORK") or "/tmp/c2p-gpu-work")
OUT = Path(os.environ.get("OUT") or REPO / ".device-out")
REC, LOGS, READ = WORK / "rec", WORK / "logs", WORK / "read"
RESULTS = WORK / "results.json"
FR_KIND = "fr" if CPU else "fr-nccl"  # which Flight Recorder dumps hold the job's collectives
P2P = {"ok": True}  # False once the healthy job hung with send/recv to itself: later jobs leave it out


# --- results --------------------------------------------------------------------------------------------------

def _load() -> dict[str, Any]:
    if RESULTS.exists():
        return json.loads(RESULTS.read_text())
    return {"mode": "cpu" if CPU else "gpu", "checks": [], "figures": {}}


_results = None


def results() -> dict[str, Any]:
    global _results
    if _results is None:
        _results = _load()
    return _results


def _save() -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS.with_suffix(".tmp")
    tmp.write_text(json.dumps(results(), indent=1, default=str))
    os.replace(tmp, RESULTS)


def check(name: str, ok: bool | None, detail: str = "", gpu_only: bool = False, info: bool = False) -> bool:
    """Record one check. ``ok=None`` or a GPU-only check in CPU mode: SKIP. ``info``: a fact, not a verdict."""
    if info:
        status = "INFO"
    elif ok is None or (gpu_only and CPU):
        status = "SKIP"
        if gpu_only and CPU:
            detail = f"(cpu dry run) {detail}"
    else:
        status = "PASS" if ok else "FAIL"
    results()["checks"].append({"name": name, "status": status, "detail": detail[:600]})
    print(f"{status} {name}: {detail[:600]}", flush=True)
    _save()
    return bool(ok)


def figure(key: str, value: Any) -> None:
    results()["figures"][key] = value
    print(f"FIGURE {key} = {json.dumps(value, default=str)[:400]}", flush=True)
    _save()


def guarded(name: str):
    """Run a group of checks; an exception in the checking code is one FAIL, the others still run."""
    def wrap(fn):
        def inner(*a, **k):
            try:
                return fn(*a, **k)
            except Exception as exc:  # a bug here or an unexpected file: report it, go on
                import traceback
                traceback.print_exc()
                check(f"{name}: checks ran", False, f"{type(exc).__name__}: {exc}")
                return None
        return inner
    return wrap


def stamp(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


# --- running things -------------------------------------------------------------------------------------------

def clean_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for key in [k for k in env if k.startswith(("COMM2PERFETTO_", "TORCH_FR_", "TORCH_NCCL_"))]:
        del env[key]
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGTERM (record forwards it to the job), then SIGKILL whatever of the tree is left."""
    tree = [*_descendants(proc.pid), proc.pid]
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=8)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        pass
    for pid in [*_descendants(proc.pid), *tree]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


class Job:
    """One ``comm2perfetto record -- torchrun ...`` run; stdout and stderr go to logs/<name>.{stdout,stderr}.log."""

    def __init__(self, name: str, script: str, job_args: list[str], record_args: list[str], nproc: int = 1,
                 timeout: float = 90) -> None:
        self.name, self.timeout = name, timeout
        self.out = REC / name
        self.stdout_path, self.stderr_path = LOGS / f"{name}.stdout.log", LOGS / f"{name}.stderr.log"
        self.cmd = [PY, "-m", "comm2perfetto", "record", "-o", str(self.out), *record_args, "--",
                    PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
                    "--monitor-interval", "0.1", str(JOBS / script), *job_args]
        self.rc: int | None = None
        self.wall_s: float | None = None
        self.timed_out = False

    def start(self) -> Job:
        LOGS.mkdir(parents=True, exist_ok=True)
        stamp(f"job {self.name}: {' '.join(self.cmd[2:6])} ... {' '.join(self.cmd[self.cmd.index('--'):][-3:])}")
        self._t0 = time.monotonic()
        self._stdout, self._stderr = open(self.stdout_path, "w"), open(self.stderr_path, "w")
        self.proc = subprocess.Popen(self.cmd, cwd=WORK, env=clean_env(), stdout=self._stdout, stderr=self._stderr,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def wait(self) -> Job:
        try:
            self.rc = self.proc.wait(timeout=max(self.timeout - (time.monotonic() - self._t0), 1))
        except subprocess.TimeoutExpired:
            self.timed_out = True
            kill_tree(self.proc)
            self.rc = self.proc.returncode
        self.wall_s = time.monotonic() - self._t0
        self._stdout.close()
        self._stderr.close()
        stamp(f"job {self.name}: exit {self.rc}{' (TIMED OUT, killed)' if self.timed_out else ''} "
              f"after {self.wall_s:.1f} s")
        figure(f"{self.name}.job_wall_s", round(self.wall_s, 2))
        return self

    def run(self) -> Job:
        return self.start().wait()

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def infos(self, what: str | None = None, rank: int | None = 0) -> list[dict[str, Any]]:
        found = []
        for line in self.stdout.splitlines():
            if line.startswith("C2P_INFO "):
                try:
                    doc = json.loads(line[len("C2P_INFO "):])
                except ValueError:
                    continue
                if (what is None or doc.get("what") == what) and (rank is None or doc.get("rank") == rank):
                    found.append(doc)
        return found

    def info(self, what: str, rank: int | None = 0) -> dict[str, Any]:
        found = self.infos(what, rank)
        return found[-1] if found else {}

    def tail(self, n: int = 6) -> str:
        lines = [ln for ln in self.stderr.splitlines() if ln.strip()]
        return " | ".join(lines[-n:])


def c2p(name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """A reader command (diagnose, merge, report); its output goes to logs/<name>.log."""
    READ.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        proc = subprocess.run([PY, "-m", "comm2perfetto", *args], cwd=WORK, env=clean_env(), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        proc = subprocess.CompletedProcess(exc.cmd, 124, exc.stdout or "", f"timed out after {timeout} s")
    (LOGS / f"{name}.log").write_text(f"$ comm2perfetto {' '.join(args)}\nexit {proc.returncode} after "
                                      f"{time.monotonic() - t0:.1f} s\n--- stdout\n{proc.stdout}\n--- stderr\n"
                                      f"{proc.stderr}")
    return proc


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def readers(job: Job, report_steps: str | None = None) -> dict[str, Any]:
    """diagnose, report (and report --steps), merge on the job's folder; returns what they wrote."""
    got: dict[str, Any] = {}
    name, folder = job.name, str(job.out)
    d = c2p(f"{name}.diagnose", "diagnose", folder, "--format", "json", "-o", str(READ / f"{name}.diagnose.json"))
    got["diagnose_rc"] = d.returncode
    got["diagnose"] = read_json(READ / f"{name}.diagnose.json")
    r = c2p(f"{name}.report", "report", folder, "--format", "json", "-o", str(READ / f"{name}.report.json"))
    got["report_rc"] = r.returncode
    got["report"] = read_json(READ / f"{name}.report.json")
    if report_steps:
        r = c2p(f"{name}.report-steps", "report", folder, "--steps", report_steps, "--format", "json", "-o",
                str(READ / f"{name}.report-steps.json"))
        got["report_steps_rc"] = r.returncode
        got["report_steps"] = read_json(READ / f"{name}.report-steps.json")
    m = c2p(f"{name}.merge", "merge", folder, "-o", str(READ / f"{name}.pftrace"))
    got["merge_rc"] = m.returncode
    got["merge_stdout"] = m.stdout
    status = (got["diagnose"] or {}).get("status")
    check(f"{name}: diagnose/report/merge ran", d.returncode in (0, 1) and r.returncode == 0 and m.returncode == 0,
          f"diagnose exit {d.returncode} status {status}, report exit {r.returncode}, merge exit {m.returncode}"
          + ("" if m.returncode == 0 else f": {m.stderr.strip()[-300:]}"))
    return got


# --- reading what a recording holds (raw: independent of the package's reader classes) -------------------------

class EventLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.header: dict[str, Any] = {}
        self.calls: dict[int, dict[str, Any]] = {}
        self.contexts: dict[int, tuple[list[str], Any, Any]] = {}
        self.sites: dict[int, str] = {}
        self.stalls: list[list] = []
        self.dumps: list[tuple[int, str, str]] = []
        self.warnings: list[tuple[int, str]] = []
        self.ranges: dict[int, dict[str, Any]] = {}
        self.steps: list[list] = []
        self.closed = False
        if not path.exists():
            return
        text = path.read_bytes().rstrip(b"\0").decode("utf-8", errors="replace")
        for i, line in enumerate(text.splitlines()):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if i == 0 and isinstance(rec, dict):
                self.header = rec
                continue
            if not isinstance(rec, list) or not rec:
                continue
            kind = rec[0]
            if kind == "b":
                self.calls[rec[1]] = {"cid": rec[1], "t": rec[2], "op": rec[3], "gid": rec[4], "seq": rec[5],
                                      "peer": rec[6], "async": rec[7], "ctx": rec[10], "step": rec[11],
                                      "captured": False, "t_return": None, "t_done": None, "error": None}
            elif kind == "e" and rec[1] in self.calls:
                self.calls[rec[1]]["t_return"] = rec[2]
            elif kind == "d" and rec[1] in self.calls:
                self.calls[rec[1]]["t_done"] = rec[2]
            elif kind == "x" and rec[1] in self.calls:
                self.calls[rec[1]]["error"] = rec[3]
            elif kind == "v" and rec[1] in self.calls:
                self.calls[rec[1]]["captured"] = True
            elif kind == "c":
                self.contexts[rec[1]] = (rec[2], rec[3], rec[4])
            elif kind == "s":
                self.sites[rec[1]] = rec[2]
            elif kind == "k":
                self.stalls.append(rec[1:])
            elif kind == "f":
                self.dumps.append((rec[1], rec[2], rec[3]))
            elif kind == "w":
                self.warnings.append((rec[1], rec[2]))
            elif kind == "r":
                self.ranges[rec[1]] = {"name": rec[3], "t": rec[2], "source": rec[5],
                                       "domain": rec[6] if len(rec) > 6 else None, "t_end": None}
            elif kind == "q" and rec[1] in self.ranges:
                self.ranges[rec[1]]["t_end"] = rec[2]
            elif kind == "p":
                self.steps.append(rec[1:])
            elif kind == "z":
                self.closed = True

    def ordered_calls(self) -> list[dict[str, Any]]:
        return [self.calls[c] for c in sorted(self.calls)]

    def nvtx_of(self, call: dict[str, Any]) -> list[str]:
        return list(self.contexts.get(call["ctx"], ([], None, None))[0])


def event_log(job: Job, rank: int = 0) -> EventLog:
    return EventLog(job.out / f"rank{rank}.events.jsonl")


def fr_dumps(job: Job, rank: int = 0, kind: str = FR_KIND) -> list[tuple[int, dict[str, Any]]]:
    """(n, content) of each ``rank<R>.<kind>.<n>.pkl``, in order. The job's own files: plain pickle."""
    out = []
    for path in job.out.glob(f"rank{rank}.{kind}.*.pkl"):
        m = re.search(rf"\.{re.escape(kind)}\.(\d+)\.pkl$", path.name)
        if not m:
            continue
        try:
            with open(path, "rb") as f:
                out.append((int(m.group(1)), pickle.load(f)))
        except Exception as exc:
            check(f"{job.name}: {path.name} readable", False, f"{type(exc).__name__}: {exc}")
    return sorted(out, key=lambda x: x[0])


def fr_latest(job: Job, rank: int = 0, kind: str = FR_KIND) -> dict[tuple[Any, Any], dict[str, Any]]:
    """Every entry, by (pg_id, record_id), as the latest dump holding it shows it."""
    entries: dict[tuple[Any, Any], dict[str, Any]] = {}
    for _n, doc in fr_dumps(job, rank, kind):
        for e in doc.get("entries", []) if isinstance(doc, dict) else []:
            entries[(e.get("pg_id"), e.get("record_id"))] = e
    return entries


def fr_dump_named(job: Job, file: str) -> dict[str, Any] | None:
    try:
        with open(job.out / file, "rb") as f:
            return pickle.load(f)
    except Exception:
        return None


def entry_for(entries: Any, seq: int | None, p2p: bool = False) -> dict[str, Any] | None:
    """The collective (or p2p) entry with this sequence number on the default group (pg_id 0): the closing
    ``*coalesced`` entry of a coalesced group, which carries its state. A batch_isend_irecv's closing entry says
    ``is_p2p: false`` and repeats the last collective's seq (torch 2.11, H200 run): it counts for the p2p seq of
    the send/recv right before it, never for that collective."""
    values = sorted(entries.values() if isinstance(entries, dict) else entries, key=lambda e: e.get("record_id", 0))
    closes_p2p = {id(e) for before, e in itertools.pairwise(values)
                  if "coalesced" in str(e.get("profiling_name")) and before.get("is_p2p")
                  and before.get("p2p_seq_id") == e.get("p2p_seq_id")}
    field = "p2p_seq_id" if p2p else "collective_seq_id"
    found = [e for e in values if e.get(field) == seq and str(e.get("pg_id")) == "0"
             and (bool(e.get("is_p2p")) or id(e) in closes_p2p) == p2p]
    coalesced = [e for e in found if "coalesced" in str(e.get("profiling_name"))]
    return (coalesced or found or [None])[-1]


def load_trace(path: Path) -> Any:
    """The merged trace decoded by the package's own checker (its module moves in the coming reorganisation)."""
    for module in ("comm2perfetto.export.check", "comm2perfetto.trace.check", "comm2perfetto.check"):
        try:
            mod = __import__(module, fromlist=["check_trace"])
        except ImportError:
            continue
        return mod.check_trace(path)
    raise ImportError("no comm2perfetto module with check_trace")


def kineto_traces(job: Job, rank: int = 0) -> list[Path]:
    return sorted(job.out.glob(f"rank{rank}.kineto.*.json.gz"))


def read_kineto(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rb") as f:
        doc = json.loads(f.read())
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    kernels = [e for e in events if e.get("cat") == "kernel"]
    names: dict[str, int] = {}
    for e in kernels:
        short = re.sub(r"\(.*", "", str(e.get("name")))[:70]
        names[short] = names.get(short, 0) + 1
    return {
        "events": len(events), "kernels": len(kernels),
        "streams": sorted({e.get("tid") for e in kernels}, key=str),
        "memcpy_memset": sum(1 for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset")),
        "record_param_comms": sum(1 for e in events if e.get("name") == "record_param_comms"),
        "profiler_steps": sorted({e.get("name") for e in events if str(e.get("name")).startswith("ProfilerStep#")}),
        "nccl_kernels": sum(1 for e in kernels if re.search(r"^nccl|ncclDevKernel|ncclKernel", str(e.get("name")))),
        "top_kernels": sorted(names.items(), key=lambda kv: -kv[1])[:8],
        "has_distributedInfo": isinstance(doc, dict) and "distributedInfo" in doc,
    }


# --- the recordings -------------------------------------------------------------------------------------------

@guarded("healthy")
def healthy() -> Job:
    """DDP with --profile-steps, NVTX in several domains, timing on (the default)."""
    job_args = ["--steps", "12", "--p2p"] + ([] if CPU else ["--premul"])
    job = Job("healthy", "ddp_job.py", job_args, ["--profile-steps", "3-5"], nproc=2 if CPU else 1,
              timeout=75).run()
    check("healthy: job exited 0", job.rc == 0, job.tail())
    done = job.info("steps_done")
    if job.timed_out and not done:
        P2P["ok"] = False
        check("healthy: hung (send/recv to itself suspected): later jobs run without p2p", False, job.tail(10))
    figure("healthy.step_ms", done.get("step_ms"))
    check("healthy: self p2p exchange correct", done.get("p2p_ok"), f"p2p_ok={done.get('p2p_ok')}")
    log = event_log(job)
    calls = log.ordered_calls()
    figure("healthy.recorded_calls", {op: sum(1 for c in calls if c["op"] == op) for op in {c["op"] for c in calls}})
    first = calls[0] if calls else {}
    check("healthy: async all_reduce recorded as async", first.get("op") == "all_reduce" and first.get("async"),
          f"first call {first.get('op')} async={first.get('async')}")
    # completion of async NCCL work: no `d` from the enqueue-time future; Flight Recorder's state says it completed
    check("healthy: async NCCL call has no completion record (future completes at enqueue)",
          first.get("t_done") is None if not CPU else first.get("t_done") is not None,
          f"t_done={first.get('t_done')} (gloo: a `d` record is expected)" if CPU else f"t_done={first.get('t_done')}")
    async_gpu = [c for c in calls if c["async"] and c["t_done"] is not None]
    check("healthy: no async call has a `d` record on NCCL", not async_gpu, f"{len(async_gpu)} with `d`",
          gpu_only=True)
    entries = fr_latest(job)
    e = entry_for(entries, first.get("seq"))
    check("healthy: Flight Recorder has the async all_reduce completed",
          e is not None and e.get("state") == "completed",
          f"seq {first.get('seq')}: state={e and e.get('state')} retired={e and e.get('retired')} "
          f"discovered_completed={e and e.get('time_discovered_completed_ns')}", gpu_only=True)
    coll = [e for e in entries.values() if not e.get("is_p2p")]
    figure("healthy.fr_entries", {"collectives": len(coll), "p2p": len(entries) - len(coll),
                                  "names": sorted({str(e.get('profiling_name')) for e in entries.values()}),
                                  "states": sorted({str(e.get('state')) for e in entries.values()})})
    retired = [e for e in coll if e.get("retired")]
    timed = [e for e in retired if isinstance(e.get("duration_ms"), float)]
    check("healthy: duration_ms on every retired NCCL collective (timing on)",
          bool(retired) and len(timed) == len(retired),
          f"{len(timed)} of {len(retired)} retired collectives have duration_ms; e.g. "
          f"{[round(x['duration_ms'], 4) for x in timed[:5]]}", gpu_only=True)
    # Ops inside a coalesced group get entries without events (never completed, never retired); the closing
    # `*coalesced` entry of the same sequence number carries the group's state.
    closed = {(e.get("pg_id"), e.get("collective_seq_id")) for e in coll
              if "coalesced" in str(e.get("profiling_name")) and e.get("state") == "completed"}
    not_completed = [(e.get("profiling_name"), e.get("state")) for e in coll if e.get("state") != "completed"
                     and (e.get("pg_id"), e.get("collective_seq_id")) not in closed]
    check("healthy: every Flight Recorder collective completed at exit", bool(coll) and not not_completed,
          f"{len(not_completed)} of {len(coll)} not completed: {not_completed[:6]}", gpu_only=True)
    p2p_entries = [(e.get("profiling_name"), e.get("state"), e.get("retired"), e.get("p2p_seq_id"),
                    e.get("duration_ms")) for e in entries.values() if e.get("is_p2p")]
    figure("healthy.fr_p2p_entries_first", p2p_entries[:6])
    figure("healthy.fr_p2p_states", sorted({(str(x[0]).split(" ")[0], str(x[1]), str(x[2])) for x in p2p_entries}))

    # NVTX domains
    ranges = list(log.ranges.values())
    domains = sorted({str(r["domain"]) for r in ranges})
    sources = sorted({r["source"] for r in ranges})
    check("healthy: NVTX ranges of several domains recorded",
          {"data", "optim", "None"} <= set(domains) and {"nvtx", "c2p"} <= set(sources)
          and (CPU or "torch.cuda.nvtx" in sources),
          f"domains {domains}, sources {sources}, {len(ranges)} ranges, "
          f"{sum(1 for r in ranges if r['t_end'] is None)} left open")
    second = calls[1] if len(calls) > 1 else {}
    ctx1, ctx2 = log.nvtx_of(first) if first else [], log.nvtx_of(second) if second else []
    check("healthy: call contexts follow NVTX's per-domain stacks",
          ctx1 == ["outer-data", "inner-default"] and ctx2 == ["inner-default"],
          f"async all_reduce in {ctx1}, sync all_reduce in {ctx2}")
    got = readers(job, report_steps="3-5")
    check("healthy: diagnose says ok", (got.get("diagnose") or {}).get("status") == "ok",
          f"status {(got.get('diagnose') or {}).get('status')}, findings "
          f"{[f.get('kind') for f in (got.get('diagnose') or {}).get('findings', [])]}")

    # duration_ms used for bandwidth
    rows = (got.get("report") or {}).get("collectives") or []
    figure("healthy.report_collectives", rows)
    row = next((r for r in rows if r.get("op") == "all_reduce"), None)
    ar = [e for e in timed if str(e.get("profiling_name")).endswith("all_reduce")]
    fr_sum_s = sum(e["duration_ms"] for e in ar) / 1000
    if row is not None and row.get("transfer_s") is not None and ar:
        rel = abs(row["transfer_s"] - fr_sum_s) / max(fr_sum_s, 1e-12)
        check("healthy: report's all_reduce transfer time is Flight Recorder's duration_ms (issue 22)",
              rel < 0.15 or abs(row["transfer_s"] - fr_sum_s) < 50e-6,
              f"transfer_s {row['transfer_s']:.6g} vs sum(duration_ms) {fr_sum_s:.6g} s over {len(ar)} entries; "
              f"count {row.get('count')}, timed {row.get('timed')}, algbw {row.get('algbw_gbps')} GB/s", gpu_only=True)
    else:
        check("healthy: report's all_reduce transfer time is Flight Recorder's duration_ms (issue 22)", False,
              f"row {row}, {len(ar)} timed all_reduce entries", gpu_only=True)
    check("healthy: algbw computed for all_reduce", row is not None and row.get("algbw_gbps") is not None,
          f"algbw_gbps {row and row.get('algbw_gbps')}, busbw {row and row.get('busbw_gbps')} (world size 1: busbw 0)",
          gpu_only=True)

    # the CUDA profiler trace
    traces = kineto_traces(job)
    check("healthy: profiler trace written", bool(traces), f"{[p.name for p in traces]}")
    if traces:
        k = read_kineto(traces[0])
        figure("healthy.kineto", {**k, "bytes": traces[0].stat().st_size})
        check("healthy: profiler trace has GPU kernels on streams", k["kernels"] > 0 and len(k["streams"]) >= 1,
              f"{k['kernels']} kernels on streams {k['streams']}, {k['memcpy_memset']} memcpy/memset, "
              f"{k['record_param_comms']} record_param_comms, steps {k['profiler_steps']}", gpu_only=True)
        check("healthy: NCCL kernels in the profiled steps", k["nccl_kernels"] > 0,
              f"{k['nccl_kernels']} nccl kernels; top kernels {k['top_kernels'][:5]}", gpu_only=True)
        check("healthy: --profile-steps trace has ProfilerStep#n", bool(k["profiler_steps"]),
              f"{k['profiler_steps']}: the recorder's own window never calls prof.step(), so merge has no "
              f"'steps (GPU)' track and report no GPU step windows for it (see userprof)", info=True)
    steps_doc = got.get("report_steps") or {}
    figure("healthy.report_steps", {"basis": steps_doc.get("basis"), "job": steps_doc.get("job"),
                                    "ranks": steps_doc.get("ranks"), "steps": [s.get("step") for s in
                                                                               steps_doc.get("steps") or []],
                                    "notes": steps_doc.get("notes")})
    check("healthy: report --steps 3-5 on the GPU basis", steps_doc.get("basis") == "gpu",
          f"basis {steps_doc.get('basis')}, steps {[s.get('step') for s in steps_doc.get('steps') or []]}, "
          f"sources {[(r, v.get('sources')) for r, v in (steps_doc.get('ranks') or {}).items()]}", gpu_only=True)
    merged_checks(job, got, gpu_steps_expected=False)
    return job


@guarded("userprof")
def userprof() -> None:
    """The job's own torch.profiler with a schedule and prof.step(): ProfilerStep#n, so GPU-true steps."""
    job_args = ["--steps", "10", "--user-profiler"] + (["--p2p"] if P2P["ok"] else []) + ([] if CPU else ["--premul"])
    job = Job("userprof", "ddp_job.py", job_args, [], nproc=2 if CPU else 1, timeout=60).run()
    check("userprof: job exited 0", job.rc == 0, job.tail())
    traces = kineto_traces(job)
    check("userprof: the job's own profiler trace saved", bool(traces), f"{[p.name for p in traces]}; "
          f"trace_ready {job.infos('user_trace_ready')}")
    if traces:
        k = read_kineto(traces[0])
        figure("userprof.kineto", {**k, "bytes": traces[0].stat().st_size})
        check("userprof: trace has ProfilerStep#n", bool(k["profiler_steps"]), f"{k['profiler_steps']}")
    got = readers(job)
    doc = got.get("report") or {}
    figure("userprof.report", {"basis": doc.get("basis"), "steps": [(s.get("step"), (s.get("job") or {}).get("span_s"))
                                                                     for s in doc.get("steps") or []],
                               "ranks": doc.get("ranks"), "notes": doc.get("notes")})
    check("userprof: report on the GPU basis", doc.get("basis") == "gpu", f"basis {doc.get('basis')}", gpu_only=True)
    check("userprof: diagnose says ok", (got.get("diagnose") or {}).get("status") == "ok",
          f"status {(got.get('diagnose') or {}).get('status')}")
    merged_checks(job, got, gpu_steps_expected=True)


def merged_checks(job: Job, got: dict[str, Any], gpu_steps_expected: bool) -> None:
    path = READ / f"{job.name}.pftrace"
    if got.get("merge_rc") != 0 or not path.exists():
        check(f"{job.name}: merged trace", False, "merge failed")
        return
    figure(f"{job.name}.merge_summary", (got.get("merge_stdout") or "").strip().splitlines()[:4])
    try:
        trace = load_trace(path)
    except Exception as exc:
        check(f"{job.name}: merged trace follows TrackEvent rules", False, f"{type(exc).__name__}: {str(exc)[:400]}")
        return
    check(f"{job.name}: merged trace follows TrackEvent rules", True, f"{path.stat().st_size} bytes")
    names: dict[str, int] = {}
    for e in trace.events:
        t = trace.tracks.get(e.track)
        names[t.name if t else "?"] = names.get(t.name if t else "?", 0) + 1
    figure(f"{job.name}.trace_tracks", names)
    gpu_tracks = {n: c for n, c in names.items() if n and n.startswith("GPU")}
    check(f"{job.name}: kernels on GPU stream tracks", bool(gpu_tracks), f"{gpu_tracks}", gpu_only=True)
    gpu_steps = [e for e in trace.events if (trace.tracks.get(e.track) or None) is not None
                 and trace.tracks[e.track].name == "steps (GPU)"]
    check(f"{job.name}: GPU-true steps track", len(gpu_steps) >= 3,
          f"{len(gpu_steps)} slices: {[(e.name, e.dur) for e in gpu_steps[:5]]}", gpu_only=True,
          info=not gpu_steps_expected)
    classes: dict[str, int] = {}
    for e in trace.events:
        t = trace.tracks.get(e.track)
        if t is not None and t.name and t.name.startswith("GPU"):
            classes[str(e.args.get("class"))] = classes.get(str(e.args.get("class")), 0) + 1
    figure(f"{job.name}.gpu_slice_classes", classes)
    check(f"{job.name}: communication kernels classed comm on the GPU tracks", classes.get("comm", 0) > 0,
          f"classes {classes}", gpu_only=True)
    sources: dict[str, int] = {}
    with_gpu_time = 0
    for e in trace.events:
        if e.kind == "slice" and "seq" in e.args and "process_group" in e.args:
            sources[str(e.args.get("source"))] = sources.get(str(e.args.get("source")), 0) + 1
            if any("gpu" in str(k).lower() for k in e.args):
                with_gpu_time += 1
    figure(f"{job.name}.collective_slice_sources", sources)
    check(f"{job.name}: collective slices joined to profiler kernels (GPU-true durations)",
          any("kineto" in s for s in sources),
          f"sources {sources}; {with_gpu_time} slices carry a gpu* arg. At world size 1 NCCL runs no kernel for an "
          f"in-place sum, so only kernel-backed collectives can join", info=True)


@guarded("notiming")
def notiming(healthy_job: Job | None) -> None:
    job = Job("notiming", "ddp_job.py", ["--steps", "8"], ["--no-gpu-timing"], nproc=1, timeout=45).run()
    check("notiming: job exited 0", job.rc == 0, job.tail())
    log = event_log(job)
    check("notiming: header says gpu_timing false", (log.header.get("config") or {}).get("gpu_timing") is False,
          f"config {log.header.get('config')}")
    entries = fr_latest(job)
    with_duration = [e for e in entries.values() if e.get("duration_ms")]
    check("notiming: no duration_ms without timing", bool(entries) and not with_duration,
          f"{len(with_duration)} of {len(entries)} entries have duration_ms; states "
          f"{sorted({str(e.get('state')) for e in entries.values()})}", gpu_only=True)
    got = readers(job)
    row = next((r for r in (got.get("report") or {}).get("collectives") or [] if r.get("op") == "all_reduce"), None)
    figure("notiming.report_all_reduce", row)
    check("notiming: diagnose says ok", (got.get("diagnose") or {}).get("status") == "ok",
          f"status {(got.get('diagnose') or {}).get('status')}")


@guarded("sync")
def sync_run() -> None:
    job = Job("sync", "ddp_job.py", ["--steps", "6"], ["--sync"], nproc=1, timeout=45).run()
    check("sync: job exited 0", job.rc == 0, job.tail())
    log = event_log(job)
    calls = log.ordered_calls()
    early = [c for c in calls if c["t_done"] is None or c["t_done"] < (c["t_return"] or 0)]
    check("sync: --sync logs measured completions (`d` after the synchronisation)",
          (bool(calls) and not early) if not CPU else None,
          f"{len(early)} of {len(calls)} calls without `d` or with `d` before `e`; first two "
          f"{[(c['op'], c['async'], c['t_done'] and (c['t_done'] - c['t_return'])) for c in calls[:2]]} "
          f"(ns from return to done)", gpu_only=True)
    figure("sync.step_ms", job.info("steps_done").get("step_ms"))
    got = readers(job)
    check("sync: diagnose says ok", (got.get("diagnose") or {}).get("status") == "ok",
          f"status {(got.get('diagnose') or {}).get('status')}")


@guarded("pending")
def pending() -> None:
    hold, after = (6.0, 3.5) if not CPU else (5.0, 3.0)
    job = Job("pending", "pending_job.py", ["--hold", str(hold), "--after", str(after)]
              + ([] if P2P["ok"] else ["--no-p2p"]), ["--stall-after", "2"], nproc=2 if CPU else 1, timeout=60).start()
    # while it hangs: wait for the live verdict, then diagnose the live folder
    deadline = time.monotonic() + 40
    verdict = job.out / "stall-verdict.json"
    while time.monotonic() < deadline and job.proc.poll() is None and not verdict.exists():
        time.sleep(0.25)
    live_doc = None
    if job.proc.poll() is None:
        time.sleep(0.5)
        c2p("pending.diagnose-live", "diagnose", str(job.out), "--format", "json", "-o",
            str(READ / "pending.diagnose-live.json"))
        live_doc = read_json(READ / "pending.diagnose-live.json")
    job.wait()
    check("pending: job exited 0", job.rc == 0, job.tail())
    issued, completed = job.info("issued"), job.info("completed")
    waited = job.info("waited")
    figure("pending.job", {"calibrated": job.info("calibrated"), "issued": issued, "completed": completed,
                           "waited": waited})
    check("pending: held work completed and correct", bool(completed) and waited.get("p2p_ok") is not False
          and waited.get("all_reduce_ok"), f"completed {bool(completed)}, {waited}")
    stall_lines = [ln for ln in job.stderr.splitlines() if "pending for" in ln]
    figure("pending.stall_lines", stall_lines)
    log = event_log(job)
    figure("pending.stalls", log.stalls)
    calls = [c for c in log.ordered_calls() if c["op"] in ("all_reduce", "batch_isend_irecv") and c["async"]]
    check("pending: held async calls have no `d` (not taken as done at enqueue)",
          bool(calls) and all(c["t_done"] is None for c in calls),
          f"{[(c['op'], c['seq'], c['t_done']) for c in calls]}", gpu_only=True)
    own = [s for s in log.stalls if s[1] in ("pending", "fr_pending")]
    if CPU:
        check("pending: stall detected (gloo: a pending patch-layer call)", bool(own), f"stalls {log.stalls}")
    else:
        # A batch whose call returned only after the hold (the first send/recv of a pair connects inside
        # ncclGroupEnd: the first run's batch did) is never pending in Flight Recorder, its closing entry's CUDA
        # events being recorded after that call returned; the patch layer reports the call instead, and while a
        # call it sees is stalled the watchdog does not look at Flight Recorder, so the all_reduce is not
        # reported from there either.
        batch_s = issued.get("batch_call_s")
        figure("pending.call_seconds", {"all_reduce": issued.get("all_reduce_call_s"), "batch": batch_s})
        fr = [s for s in own if s[1] == "fr_pending"]
        if isinstance(batch_s, (int, float)) and batch_s > hold / 2:
            check("pending: stall detected (the batch call held the CPU: by the patch layer)",
                  any("batch_isend_irecv" in ln for ln in stall_lines),
                  f"batch call {batch_s} s; {len(own)} stall records {[s[1] for s in own]}; lines: {stall_lines}")
        else:
            coll = any("nccl:all_reduce" in ln for ln in stall_lines)
            p2p = any(re.search(r"nccl:(send|recv)", ln) for ln in stall_lines)
            check("pending: stall detected from Flight Recorder, per counter (collective and p2p)",
                  len(fr) >= (2 if P2P["ok"] else 1) and coll and (p2p or not P2P["ok"]),
                  f"{len(own)} stall records {[s[1] for s in own]}; batch call {batch_s} s; lines: {stall_lines}")
    t_issued, t_done = issued.get("t_ns"), completed.get("t_ns")
    if t_issued and t_done:
        late = [s for s in log.stalls if s[0] > t_done + 1.5e9]
        check("pending: no stall reported after the held work completed (no false stall)", not late,
              f"{len(late)} stall(s) {[(round((s[0] - t_done) / 1e9, 2), s[1]) for s in late]} s after completion; "
              f"a p2p entry of a batch (coalesced per-op entry, no events) never retires in Flight Recorder" if late
              else f"stalls at {[round((s[0] - t_issued) / 1e9, 2) for s in log.stalls]} s after issue; "
                   f"completion at {round((t_done - t_issued) / 1e9, 2)} s")
    # Flight Recorder's state at the stall, and at the end
    stall_dumps = [f for _t, f, reason in log.dumps if reason == "stall" and f".{FR_KIND}." in f]
    ar = next((c for c in calls if c["op"] == "all_reduce"), None)
    at_stall = fr_dump_named(job, stall_dumps[0]) if stall_dumps else None
    e_stall = entry_for(at_stall.get("entries", []), ar["seq"]) if at_stall and ar else None
    e_end = entry_for(fr_latest(job), ar["seq"]) if ar else None
    check("pending: Flight Recorder showed the all_reduce unfinished at the stall and completed at the end",
          e_stall is not None and e_stall.get("state") != "completed" and e_end is not None
          and e_end.get("state") == "completed",
          f"stall dump {stall_dumps[:1]}: {e_stall and e_stall.get('state')}; end: {e_end and e_end.get('state')}, "
          f"duration_ms {e_end and e_end.get('duration_ms')}", gpu_only=True)
    live_verdict = read_json(verdict)
    figure("pending.live_verdict", (live_verdict or {}).get("verdict"))
    held = (live_verdict or {}).get("verdict") or {}
    check("pending: live verdict written while the work was held", live_verdict is not None,
          f"status {held.get('status')}, findings "
          f"{[(f.get('kind'), f.get('op'), f.get('seq')) for f in held.get('findings', [])]}")
    figure("pending.diagnose_live", live_doc and {"status": live_doc.get("status"),
                                                  "findings": [(f.get("kind"), f.get("op"), f.get("seq"))
                                                               for f in live_doc.get("findings", [])]})
    named = [(f.get("kind"), f.get("op"), f.get("seq"), f.get("detail", "")[:120])
             for f in (live_doc or {}).get("findings", [])]
    check("pending: diagnose on the live folder names the held collective",
          live_doc is not None and any(f.get("op") in ("all_reduce",) or "send" in str(f.get("op"))
                                       for f in live_doc.get("findings", [])),
          f"{live_doc and live_doc.get('status')}: {named}")
    got = readers(job)
    d = got.get("diagnose") or {}
    figure("pending.diagnose_after", {"status": d.get("status"), "findings": [
        (f.get("kind"), f.get("op"), f.get("seq"), f.get("resolved")) for f in d.get("findings", [])],
        "notes": d.get("notes")})
    held = [f for f in d.get("findings", []) if f.get("resolved") and (f.get("op") == "all_reduce"
                                                                         or "send" in str(f.get("op")))]
    check("pending: diagnose afterwards names the stall, resolved (the job went on)", bool(held),
          f"status {d.get('status')}, findings "
          f"{[(f.get('kind'), f.get('op'), f.get('seq'), f.get('resolved')) for f in d.get('findings', [])]}")
    idle = job.info("idle_done")
    figure("pending.watchdog_view_after", {k: v for k, v in idle.items() if k in ("unfinished", "active")})
    check("pending: the watchdog sees nothing unfinished once everything completed (batched ops by their closing "
          "entry)", idle.get("unfinished") == {}, f"unfinished() {idle.get('unfinished')}; still 'active' in FR: "
          f"{idle.get('active')}", gpu_only=True)
    rows_checks(job)


def rows_checks(job: Job) -> None:
    """What the readers make of the held batch (issue 26, item 3): the default group's collectives are its
    all_reduces, none a ``coalesced`` row, and the batch's send and recv take its closing entry's state."""
    from comm2perfetto.diagnose.diagnosis import diagnose
    from comm2perfetto.match import load_job

    loaded = load_job([job.out])
    rows = [(c.seq, sorted({s.op for s in c.signatures if s is not None}), c.states)
            for cs in loaded.collectives.values() for c in cs]
    transfers = [(t.src, t.dst, t.send and t.send.state, t.recv and t.recv.state)
                 for ts in loaded.p2p.values() for t in ts]
    figure("pending.rows", {"collectives": rows, "transfers": transfers})
    check("pending: rows are the all_reduces and the send/recv, completed (no 'coalesced' collective)",
          bool(rows) and all(ops == ["all_reduce"] for _, ops, _ in rows)
          and all(st == "completed" for _, _, states in rows for st in states)
          and (not P2P["ok"] or (bool(transfers) and all(t[2] == t[3] == "completed" for t in transfers))),
          f"collectives {rows}; transfers {transfers}", gpu_only=True)
    d = diagnose(loaded)
    figure("pending.verdict_for_issue_21", {"status": d.status, "findings": [
        (f.kind, f.op, f.seq, f.resolved, f.culprit_ranks) for f in d.findings]})


@guarded("p2pidle")
def p2pidle() -> None:
    """The control for false stalls: the same calls as pending complete at once, then 4 s idle with
    --stall-after 2. Flight Recorder's per-op entries of a batched send/recv carry no events and are never
    retired: if the watchdog counted them as unfinished, it would report a stall here."""
    if not P2P["ok"]:
        check("p2pidle: skipped (send/recv to itself hung in healthy)", None, "")
        return
    job = Job("p2pidle", "pending_job.py", ["--hold", "0", "--after", "4"], ["--stall-after", "2"],
              nproc=2 if CPU else 1, timeout=45).run()
    check("p2pidle: job exited 0", job.rc == 0, job.tail())
    log = event_log(job)
    idle = job.info("idle_done")
    figure("p2pidle.watchdog_view", {k: v for k, v in idle.items() if k in ("unfinished", "active")})
    check("p2pidle: the watchdog sees nothing unfinished at the end", idle.get("unfinished") == {},
          f"unfinished() {idle.get('unfinished')}", gpu_only=True)
    check("p2pidle: no stall reported while everything had completed", not log.stalls,
          f"{len(log.stalls)} stall records {[s[1] for s in log.stalls]}; stderr "
          f"{[ln for ln in job.stderr.splitlines() if 'pending for' in ln][:3]}; watchdog sees "
          f"unfinished={idle.get('unfinished')}")
    d = c2p("p2pidle.diagnose", "diagnose", str(job.out), "--format", "json", "-o", str(READ / "p2pidle.diagnose.json"))
    doc = read_json(READ / "p2pidle.diagnose.json") or {}
    check("p2pidle: diagnose says ok", doc.get("status") == "ok", f"exit {d.returncode}, status {doc.get('status')}, "
          f"findings {[(f.get('kind'), f.get('op'), f.get('seq')) for f in doc.get('findings', [])]}")


@guarded("graph")
def graph(timing: bool = True) -> Job | None:
    name = "graph" if timing else "graph-notiming"
    record_args = ["--sync", "--fr-buffer", "64", "--stall-after", "2"] + ([] if timing else ["--no-gpu-timing"])
    job = Job(name, "graph_job.py", ["--captured", "40"], record_args, nproc=1, timeout=45).run()
    check(f"{name}: job exited 0 (capture under --sync{'' if timing else ', no timing'})", job.rc == 0, job.tail(8))
    cap, rep = job.info("captured"), job.info("replayed")
    check(f"{name}: replay result correct", rep.get("ok"), f"{rep}", gpu_only=True)
    log = event_log(job)
    captured = [c for c in log.ordered_calls() if c["captured"]]
    check(f"{name}: captured calls marked `v`", len(captured) == 40, f"{len(captured)} `v` records", gpu_only=True)
    t0, t1 = cap.get("capture_begin_ns"), cap.get("capture_end_ns")
    if t0 and t1:
        inside = [d for d in log.dumps if t0 <= d[0] <= t1]
        after = [d for d in log.dumps if d[0] > t1 and d[2] == "periodic"]
        check(f"{name}: no Flight Recorder dump during the capture", not inside,
              f"{len(inside)} dumps inside the {round((t1 - t0) / 1e9, 2)} s capture; {len(after)} periodic after it; "
              f"all dumps {[(d[2], round((d[0] - t0) / 1e9, 2)) for d in log.dumps]}", gpu_only=True)
        check(f"{name}: the periodic dump held back by the capture came after it", bool(after),
              f"{len(after)} periodic dumps after the capture", gpu_only=True)
        figure(f"{name}.dumps_rel_capture_s", [(d[2], round((d[0] - t0) / 1e9, 3)) for d in log.dumps])
    synced_captured = [c for c in captured if c["t_done"] is not None]
    check(f"{name}: --sync did not synchronise captured calls", not synced_captured,
          f"{len(synced_captured)} captured calls with `d`", gpu_only=True)
    others = [c for c in log.ordered_calls() if not c["captured"]]
    check(f"{name}: --sync synchronised the uncaptured calls", bool(others) and all(c["t_done"] for c in others),
          f"{sum(1 for c in others if c['t_done'])} of {len(others)} with `d`", gpu_only=True)
    figure(f"{name}.warnings", [w for _t, w in log.warnings])
    entries = fr_latest(job)
    seqs = {c["seq"] for c in captured}
    in_fr = [e for e in entries.values() if e.get("collective_seq_id") in seqs and not e.get("is_p2p")]
    figure(f"{name}.fr", {"entries": len(entries), "captured_seqs_in_fr": len(in_fr),
                          "seqs": sorted(e.get("collective_seq_id") for e in entries.values() if not e.get("is_p2p"))})
    got = readers(job)
    check(f"{name}: diagnose says ok (captured calls left out of matching)",
          (got.get("diagnose") or {}).get("status") == "ok",
          f"status {(got.get('diagnose') or {}).get('status')}, findings "
          f"{[(f.get('kind'), f.get('seq')) for f in (got.get('diagnose') or {}).get('findings', [])]}")
    return job


def record_all() -> None:
    for folder in (REC, LOGS, READ):
        folder.mkdir(parents=True, exist_ok=True)
    stamp(f"recordings ({'cpu dry run, gloo' if CPU else 'gpu, nccl'}) into {REC}")
    h = healthy()
    stamp("healthy done")
    pending()
    stamp("pending done")
    p2pidle()
    stamp("p2pidle done")
    g = graph()
    if g is not None and g.rc != 0 and not CPU:
        stamp("graph failed: the same without TORCH_NCCL_ENABLE_TIMING, to tell the cause")
        graph(timing=False)
    stamp("graph done")
    userprof()
    stamp("userprof done")
    sync_run()
    notiming(h)
    stamp("recordings done")


# --- costs ----------------------------------------------------------------------------------------------------

def costs() -> None:
    LOGS.mkdir(parents=True, exist_ok=True)
    out, js = REC / "costs", WORK / "costs.json"
    args = [PY, str(JOBS / "costs.py"), "--out", str(out), "--json", str(js)]
    if CPU:
        args += ["--calls", "400", "--ring", "2000", "--ddp-rounds", "2", "--ddp-steps", "5"]
    stamp("costs: " + " ".join(args[1:]))
    t0 = time.monotonic()
    with open(LOGS / "costs.stdout.log", "w") as so, open(LOGS / "costs.stderr.log", "w") as se:
        try:
            rc = subprocess.run(args, cwd=WORK, env=clean_env(), stdout=so, stderr=se, timeout=150,
                                stdin=subprocess.DEVNULL).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    stamp(f"costs: exit {rc} after {time.monotonic() - t0:.1f} s")
    doc = read_json(js) or {}
    err = (LOGS / "costs.stderr.log").read_text(errors="replace").strip().splitlines()
    check("costs: ran", rc == 0, f"exit {rc}; {' | '.join(err[-4:])}")
    a = doc.get("per_call") or {}
    if a:
        figure("cost.per_call_us", {"torch": round(a["torch"]["median_us"], 2),
                                    "recorded": round(a["recorded"]["median_us"], 2),
                                    "overhead_median": round(a["overhead_median_us"], 2),
                                    "overhead_block_median": round(a["overhead_block_median_us"], 2),
                                    "overhead_mean": round(a["overhead_mean_us"], 2), "calls": a["torch"]["calls"]})
        check("costs: recorder patched all_reduce", doc.get("patched") is True, f"patched={doc.get('patched')}")
    b = doc.get("dumps") or {}
    if b:
        summary: dict[str, Any] = {}
        for row in b.get("rows", []):
            s = summary.setdefault(row["what"], {"wall_ms": [], "max_tick_gap_ms": [], "bytes": row.get("bytes")})
            if "error" in row:
                s["error"] = row["error"]
                continue
            s["wall_ms"].append(round(row["wall_ms"], 1))
            gap = row.get("max_tick_gap_ms")
            s["max_tick_gap_ms"].append(round(gap, 1) if isinstance(gap, (int, float)) else None)
        figure("cost.dumps", {"entries_in_ring": b.get("entries_in_ring"), "idle_max_tick_gap_ms":
                              round(b.get("idle_max_tick_gap_ms") or 0, 2), "by_kind": summary,
                              **{k: v for k, v in b.items() if k.startswith("p2p_")}})
        periodic = summary.get("recorder periodic dump (no stacks)", {}).get("wall_ms") or []
        ring = b.get("entries_in_ring")
        if periodic and isinstance(ring, int) and ring > 1:
            # one periodic dump per half ring of collectives: its cost spread over them
            median_ms = sorted(periodic)[len(periodic) // 2]
            figure("cost.periodic_dump_us_per_collective", round(median_ms * 1000 / (ring // 2), 3))
    c = doc.get("nccl_timing") or {}
    if c:
        figure("cost.nccl_timing", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in c.items()
                                    if not isinstance(v, dict)} | {
            "on_ms": round(c["timing_on"]["step_ms_median"], 4), "off_ms": round(c["timing_off"]["step_ms_median"], 4)})
        if not CPU:
            check("costs: TORCH_NCCL_ENABLE_TIMING took effect per group",
                  c.get("timing_on_fr_with_duration", 0) > 0 and c.get("timing_off_fr_with_duration", 1) == 0,
                  f"timing on: {c.get('timing_on_fr_with_duration')}/{c.get('timing_on_fr_entries')} entries with "
                  f"duration_ms; off: {c.get('timing_off_fr_with_duration')}/{c.get('timing_off_fr_entries')}")
    figure("cost.env", {k: doc.get(k) for k in ("torch", "gpu", "nccl", "cpu_mode")})


# --- pytest's figures -----------------------------------------------------------------------------------------

def pytest_figures(log_path: str) -> None:
    text = Path(log_path).read_text(errors="replace") if Path(log_path).exists() else ""
    m = re.search(r"DDP step: ([0-9.]+) ms with the default ring, ([0-9.]+) ms with a 64-entry ring.*?: ([0-9.]+)x",
                  text)
    if m:
        figure("cost.periodic_dumps_ddp_step_ms", {"ring_20000": float(m.group(1)), "ring_64": float(m.group(2)),
                                                   "ratio": float(m.group(3))})
    outcomes = re.findall(r"^(tests/gpu/\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED)", text, re.M)
    figure("pytest.outcomes", outcomes)
    tail = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", ln)]
    check("pytest tests/gpu", bool(outcomes) and all(o == "PASSED" for _, o in outcomes),
          (tail[-1] if tail else "no summary line") + f"; {sum(1 for _, o in outcomes if o != 'PASSED')} not passed",
          gpu_only=True)


# --- packing what comes back ----------------------------------------------------------------------------------

MAX_FILE = 3 * 1024 * 1024
MAX_TOTAL = 12 * 1024 * 1024


def pack() -> None:
    pack_root = WORK / "pack"
    dest = pack_root / "fixtures"
    shutil.rmtree(pack_root, ignore_errors=True)
    dest.mkdir(parents=True)
    manifest, total, kineto_kept = [], 0, 0

    def add(src: Path, rel: str, limit: int = MAX_FILE) -> None:
        nonlocal total, kineto_kept
        size = src.stat().st_size
        is_kineto = ".kineto." in src.name or src.name.endswith((".pt.trace.json", ".pt.trace.json.gz"))
        reason = None
        if size > limit:
            reason = f"over {limit // 1024} KiB"
        elif is_kineto and not (rel.startswith(("recordings/healthy/", "recordings/userprof/"))
                                and src.name.startswith("rank0.") and kineto_kept < 2):
            reason = "profiler traces: rank 0's of healthy (--profile-steps) and userprof (ProfilerStep#n) kept"
        elif total + size > MAX_TOTAL:
            reason = "total budget"
        if reason:
            manifest.append(f"left out {rel} ({size} bytes): {reason}")
            return
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
        total += size
        kineto_kept += is_kineto
        manifest.append(f"{rel} {size}")

    order = ["healthy", "pending", "p2pidle", "graph", "graph-notiming", "userprof", "sync", "notiming", "costs"]
    folders = [REC / n for n in order if (REC / n).is_dir()] + sorted(p for p in REC.glob("*") if p.is_dir()
                                                                       and p.name not in order)
    for folder in folders:
        for src in sorted(p for p in folder.rglob("*") if p.is_file()):
            rel = f"recordings/{folder.name}/{src.relative_to(folder)}"
            if folder.name == "costs" and not src.name.endswith(".jsonl") and not src.name.startswith("job."):
                manifest.append(f"left out {rel} ({src.stat().st_size} bytes): a full 20,000-entry ring")
                continue
            add(src, rel)
    for src in sorted(READ.glob("*.json")):
        add(src, f"read/{src.name}")
    saved = WORK / "fixtures"  # tests/gpu's own jobs (COMM2PERFETTO_SAVE_FIXTURES)
    for src in sorted(p for p in saved.rglob("*") if p.is_file()) if saved.is_dir() else []:
        add(src, f"pytest/{src.relative_to(saved)}", limit=1024 * 1024)
    for src in sorted(LOGS.glob("*.log")):
        add(src, f"logs/{src.name}", limit=512 * 1024)
    if RESULTS.exists():
        add(RESULTS, "results.json")
    (dest / "MANIFEST.txt").write_text("\n".join(manifest) + "\n")
    OUT.mkdir(parents=True, exist_ok=True)
    with tarfile.open(OUT / "fixtures.tgz", "w:gz") as tar:
        tar.add(dest, arcname="fixtures")
    stamp(f"pack: {OUT / 'fixtures.tgz'} ({(OUT / 'fixtures.tgz').stat().st_size} bytes, {total} bytes unpacked, "
          f"{sum(1 for m in manifest if m.startswith('left out'))} files left out)")
    write_summary()


def write_summary() -> str:
    res = results()
    lines = [f"comm2perfetto GPU check ({res.get('mode')}), {time.strftime('%Y-%m-%d %H:%M:%S')}"]
    env = res["figures"].get("cost.env") or {}
    lines.append(f"torch {env.get('torch')}, GPU {env.get('gpu')}, NCCL {env.get('nccl')}")
    counts: dict[str, int] = {}
    for c in res["checks"]:
        counts[c["status"]] = counts.get(c["status"], 0) + 1
    lines.append("checks: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    lines.append("")
    for c in res["checks"]:
        if c["status"] in ("FAIL", "SKIP"):
            lines.append(f"{c['status']} {c['name']}: {c['detail'][:300]}")
    for c in res["checks"]:
        if c["status"] in ("PASS", "INFO"):
            lines.append(f"{c['status']} {c['name']}")
    lines.append("")
    lines.append("figures:")
    figures = res["figures"]
    dumps = figures.get("cost.dumps") or {}
    if dumps:
        lines.append(f"  cost.dumps: {dumps.get('entries_in_ring')} entries in the ring; idle ticker gap "
                     f"{dumps.get('idle_max_tick_gap_ms')} ms; p2p ring: active entries "
                     f"{dumps.get('p2p_ring_active_entries')} {dumps.get('p2p_ring_active_names')}, watchdog's "
                     f"unfinished() {dumps.get('p2p_ring_unfinished')}; per kind: wall ms / longest ticker gap ms "
                     f"(GIL held; None: shorter than a tick):")
        for kind, v in (dumps.get("by_kind") or {}).items():
            lines.append(f"    {kind}: {v.get('wall_ms')} / {v.get('max_tick_gap_ms')}"
                         + (f" bytes {v['bytes']}" if v.get("bytes") else "")
                         + (f" ERROR {v['error']}" if v.get("error") else ""))
    keys = ["cost.per_call_us", "cost.nccl_timing", "cost.periodic_dumps_ddp_step_ms",
            "cost.periodic_dump_us_per_collective", "pytest.outcomes",
            "healthy.step_ms", "sync.step_ms", "healthy.kineto", "userprof.kineto", "healthy.collective_slice_sources",
            "healthy.gpu_slice_classes", "healthy.fr_p2p_states", "pending.call_seconds", "pending.stall_lines",
            "pending.watchdog_view_after", "pending.rows", "pending.verdict_for_issue_21",
            "p2pidle.watchdog_view", "graph.dumps_rel_capture_s", "graph.warnings", "graph.fr", "userprof.report"]
    for key in keys:
        if key in figures:
            lines.append(f"  {key}: {json.dumps(figures[key], default=str)[:500]}")
    walls = {k.split(".")[0]: v for k, v in figures.items() if k.endswith(".job_wall_s")}
    lines.append(f"  job wall seconds: {walls}")
    text = "\n".join(lines) + "\n"
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "summary.txt").write_text(text)
    if RESULTS.exists():
        shutil.copy2(RESULTS, OUT / "results.json")
    return text


def main() -> int:
    cmd = sys.argv[1] if len(sys.argv) > 1 else "record-all"
    if cmd == "record-all":
        record_all()
    elif cmd == "costs":
        costs()
    elif cmd == "pytest-figures":
        pytest_figures(sys.argv[2])
    elif cmd == "pack":
        pack()
    elif cmd == "summary":
        print(write_summary())
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
