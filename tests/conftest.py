"""Shared fixtures.

- ``_no_recorder_left_behind`` (autouse): fails any test that leaves comm2perfetto's patches, hooks or active
  recorder installed in the test process, as pyinstrument's suite does for its profilers.
- ``record_job`` (per test) and ``module_jobs`` (per module, for a job several tests read): run a tiny job
  script through the real ``comm2perfetto record`` CLI (a subprocess, so every rank is a real process with a
  real gloo group; torchrun ``--standalone`` picks a free port) and read back what it wrote. Every job has a
  timeout, after which its whole process tree is killed.
- ``clean_env``: the environment for subprocesses, without this process's comm2perfetto/FR settings.
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# --- hygiene ------------------------------------------------------------------------------------------------


def _recorder_leftovers() -> list[str]:
    """What comm2perfetto still has installed in this process (imports no torch)."""
    from comm2perfetto.record import bootstrap, capture, dispatch, nvtx, patch, profiler, session, state

    left = []
    if patch.installed():
        left.append("torch.distributed patches (patch.uninstall())")
    if dispatch.installed():
        left.append("the dispatcher fallback's kernels (dispatch.uninstall())")
    if state.recorder is not None:
        left.append("an active recorder (state.recorder)")
    if bootstrap._finder in sys.meta_path:
        left.append("the post-import hook (bootstrap.remove_hooks())")
    if nvtx._patched:
        left.append("NVTX mirroring (nvtx.unmirror_all())")
    if profiler._originals:
        left.append("the torch.profiler wrappers")
    if capture._patched:
        left.append("the CUDA graph capture wrappers (capture.uninstall())")
    if session._parts:
        left.append(f"session parts {sorted(session._parts)}")
    if session._previous_excepthook is not None or sys.excepthook is session._on_uncaught:
        left.append("the sys.excepthook (session.remove_exit_handlers())")
    if session._on_signal in (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)):
        left.append("the SIGTERM/SIGINT handlers (session.remove_exit_handlers())")
    return left


def _clean_up_recorder() -> None:
    """Best effort, so that one leaky test does not make every later test fail too."""
    from comm2perfetto.record import bootstrap, capture, dispatch, nvtx, patch, session, state

    try:
        session.stop("test-cleanup")
    except Exception as exc:  # the leak is reported anyway; keep cleaning
        print(f"conftest: stopping the leaked recorder failed: {exc!r}", file=sys.stderr)
    dispatch.uninstall()
    session.remove_exit_handlers()
    session.configure(None)
    session._parts.clear()
    state.recorder = None
    patch.uninstall()
    nvtx.unmirror_all()
    capture.uninstall()
    bootstrap.remove_hooks()


@pytest.fixture(autouse=True)
def _no_recorder_left_behind():
    before = _recorder_leftovers()
    if before:  # a test outside our control leaked: start from a clean slate rather than blame this one
        _clean_up_recorder()
    yield
    left = _recorder_leftovers()
    if left:
        _clean_up_recorder()
        pytest.fail("test left comm2perfetto installed in the test process: " + "; ".join(left))


def gloo_flight_recorder() -> bool:
    """Whether this torch has a Flight Recorder for gloo (``_dump_fr_trace``: 2.8 on). Torch 2.4-2.7 write no
    gloo dump at all; the dispatcher fallback records DDP's collectives there."""
    import torch._C._distributed_c10d as c10d_C

    return hasattr(c10d_C, "_dump_fr_trace")


def needs_gloo_flight_recorder() -> pytest.MarkDecorator:
    """Skip a test of Flight Recorder's gloo dumps on a torch that has none (2.4-2.7), saying so."""
    return pytest.mark.skipif(not gloo_flight_recorder(), reason="no Flight Recorder for gloo on this torch (2.4-2.7)")


# --- running jobs -------------------------------------------------------------------------------------------

JOB_TIMEOUT_S = 90.0


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc: no psutil here)."""
    children: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                text = f.read()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        children.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a process we started and everything it started (the job runs in its own session)."""
    for pid in [*_descendants(proc.pid), proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=10)


def communicate(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        out, err = proc.communicate()
        pytest.fail(f"job did not finish within {timeout:.0f}s\nstdout:\n{out}\nstderr:\n{err}")


def job_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for key in [k for k in env if k.startswith(("COMM2PERFETTO_", "TORCH_FR_", "TORCH_NCCL_"))]:
        del env[key]  # the test process's own settings must not leak into the job
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def record_cmd(out: Path, job: Sequence[str], record_args: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "comm2perfetto.cli", "record", "-o", str(out), *record_args, "--", *job]


def torchrun(nproc: int, script: str = "job.py") -> list[str]:
    # --standalone: c10d rendezvous on localhost:0, so every job gets a free port.
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
            "--monitor-interval", "0.1", script]


@dataclass
class JobResult:
    returncode: int
    stdout: str
    stderr: str
    out: Path
    cwd: Path
    script: str

    def line_of(self, marker: str) -> int:
        """Line number (1-based) of the job script's only line containing ``marker``."""
        lines = [i for i, text in enumerate(self.script.splitlines(), 1) if marker in text]
        assert len(lines) == 1, f"marker {marker!r} is on lines {lines}"
        return lines[0]

    def log(self, rank: int) -> Any:
        from comm2perfetto.sources.event_log import read_event_log

        return read_event_log(self.out / f"rank{rank}.events.jsonl")

    def stall_between(self, rank: int, after_ns: int, before_ns: int) -> Any:
        """The first stall ``rank`` logged in that window. With a short ``--stall-after`` a loaded machine
        can make a rank wait that long elsewhere (the other rank held up by its first dump's imports), and
        that extra stall is the recorder doing its job; a test checks the stall its job arranged."""
        stalls = [s for s in self.log(rank).stalls if after_ns < s.t_ns < before_ns]
        assert stalls, f"rank {rank} logged no stall in the window; all its stalls: {self.log(rank).stalls}"
        return stalls[0]

    def job_file(self) -> dict:
        """The job file `record` wrote (``job.<host>.<pid>.json``, one per record process)."""
        (path,) = self.out.glob("job.*.json")
        return json.loads(path.read_text())

    def fr_dumps(self, rank: int) -> list[Path]:
        return sorted(self.out.glob(f"rank{rank}.fr.*.pkl"), key=lambda p: int(p.name.split(".")[2]))

    def fr_entries(self, rank: int) -> list[dict]:
        """Every Flight Recorder entry of ``rank``'s dumps, deduplicated by (pg_id, record_id)."""
        entries: dict[tuple, dict] = {}
        for path in self.fr_dumps(rank):
            with open(path, "rb") as f:  # our own job's dump: a plain pickle.load is fine here
                for entry in pickle.load(f)["entries"]:
                    entries[(entry["pg_id"], entry["record_id"])] = entry
        return [entries[k] for k in sorted(entries)]

    def explain(self) -> str:
        return f"exit status {self.returncode}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"


class JobRunner:
    """Writes ``job.py`` into a fresh folder and runs it under ``comm2perfetto record``."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self._count = 0

    def folder(self) -> Path:
        self._count += 1
        cwd = self.tmp_path / f"job{self._count}"
        cwd.mkdir()
        return cwd

    def write(self, cwd: Path, script: str, name: str = "job.py") -> str:
        script = textwrap.dedent(script).lstrip("\n")
        (cwd / name).write_text(script)
        return script

    def start(self, script: str, *, nproc: int = 2, record_args: Sequence[str] = (), job: Sequence[str] = (),
              env: dict[str, str] | None = None) -> RunningJob:
        """Start recording ``script`` run by torchrun on ``nproc`` ranks (or by ``job``, a command run in the
        job's folder); returns at once."""
        cwd = self.folder()
        self.write(cwd, script)
        return self.start_in(cwd, list(job) or torchrun(nproc), record_args=record_args, env=env)

    def start_in(self, cwd: Path, job: Sequence[str], *, record_args: Sequence[str] = (),
                 env: dict[str, str] | None = None) -> RunningJob:
        """Start ``comm2perfetto record -o cwd/out [record_args] -- job`` in ``cwd`` (holding ``job.py``)."""
        out = cwd / "out"
        proc = subprocess.Popen(record_cmd(out, job, record_args), cwd=cwd, env=job_env(**(env or {})),
                                text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return RunningJob(proc, cwd, out, (cwd / "job.py").read_text() if (cwd / "job.py").exists() else "")

    def run(self, script: str, *, timeout: float = JOB_TIMEOUT_S, **kwargs: Any) -> JobResult:
        """Record ``script`` (see ``start``) and wait for the job to end."""
        return self.start(script, **kwargs).finish(timeout)


@dataclass
class RunningJob:
    proc: subprocess.Popen
    cwd: Path
    out: Path
    script: str

    def wait_for(self, name: str, timeout: float = JOB_TIMEOUT_S) -> None:
        """Wait until the job creates ``name`` in its folder; fail at once if the job ends first."""
        self.wait_until((self.cwd / name).exists, name, timeout)

    def wait_until(self, done: Callable[[], bool], what: str, timeout: float = JOB_TIMEOUT_S) -> None:
        """Wait until ``done()`` (reading the job's files as it runs); fail at once if the job ends first."""
        deadline = time.monotonic() + timeout
        while not done():
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                pytest.fail(f"job exited with {self.proc.returncode} before {what}\n{out}\n{err}")
            if time.monotonic() > deadline:
                kill_tree(self.proc)
                pytest.fail(f"no {what} within {timeout:.0f}s")
            time.sleep(0.1)

    def finish(self, timeout: float = JOB_TIMEOUT_S) -> JobResult:
        stdout, stderr = communicate(self.proc, timeout)
        return JobResult(self.proc.returncode, stdout, stderr, self.out, self.cwd, self.script)


@pytest.fixture
def record_job(tmp_path: Path) -> JobRunner:
    return JobRunner(tmp_path)


@pytest.fixture(scope="module")
def module_jobs(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> JobRunner:
    """A JobRunner for module-scoped fixtures: one job whose output several tests read."""
    return JobRunner(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]))


@pytest.fixture
def fr_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """enable() writes Flight Recorder and NCCL settings into os.environ: put them back afterwards, and start
    without this process's own."""
    for key in [k for k in os.environ if k.startswith(("COMM2PERFETTO_", "TORCH_FR_", "TORCH_NCCL_"))]:
        monkeypatch.delenv(key)


@pytest.fixture
def clean_env() -> dict[str, str]:
    """The environment for a subprocess, without this process's comm2perfetto/Flight Recorder settings."""
    return job_env()
