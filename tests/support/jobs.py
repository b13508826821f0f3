"""Running tiny jobs as tests do: each script recorded through the real ``comm2perfetto record`` CLI (a
subprocess, so every rank is a real process with a real gloo group; torchrun ``--standalone`` picks a free port),
with a timeout after which the job's whole process tree is killed, and what it wrote read back.

``JobRunner`` is what the ``record_job`` and ``module_jobs`` fixtures of tests/conftest.py hand a test::

    result = record_job.run("import torch.distributed as dist ...", nproc=2)
    result.returncode, result.log(0).stalls, result.fr_entries(1)

The plain functions (``job_env``, ``record_cmd``, ``torchrun``, ``communicate``, ``kill_tree``) serve tests that
start their own command.
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
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from support.cli import COMMAND

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
    return [*COMMAND, "record", "-o", str(out), *record_args, "--", *job]


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def record_example(out: Path, example: str, args: Sequence[str] = (), record_args: Sequence[str] = (),
                   timeout: float = 180) -> tuple[int, str]:
    """Record ``examples/EXAMPLE`` on 2 ranks with ``comm2perfetto record -o OUT``: (its exit status, stderr)."""
    command = record_cmd(out, torchrun(2, str(EXAMPLES / example)) + list(args), record_args)
    proc = subprocess.Popen(command, env=job_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    _, err = communicate(proc, timeout)
    return proc.returncode, err


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

    def run_together(self, scripts: dict[str, tuple[str, dict[str, Any]]],
                     timeout: float = JOB_TIMEOUT_S) -> dict[str, JobResult]:
        """Record every ``name: (script, start's keyword arguments)`` at once and wait for all: for jobs that
        mostly wait (a hang until gloo's timeout), so that their waits overlap. One thread a job reads its
        output, so that none blocks on a full pipe."""
        lock = threading.Lock()  # folders are numbered

        def one(script: str, kwargs: dict[str, Any]) -> JobResult:
            with lock:
                running = self.start(script, **kwargs)
            return running.finish(timeout)

        with ThreadPoolExecutor(len(scripts)) as pool:
            futures = {name: pool.submit(one, script, kwargs) for name, (script, kwargs) in scripts.items()}
            return {name: future.result() for name, future in futures.items()}


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
                out, err = self.proc.communicate()
                files = sorted(p.name for p in self.out.iterdir()) if self.out.is_dir() else "no output folder"
                pytest.fail(f"no {what} within {timeout:.0f}s; the job's files: {files}\n{out}\n{err}")
            time.sleep(0.1)

    def finish(self, timeout: float = JOB_TIMEOUT_S) -> JobResult:
        stdout, stderr = communicate(self.proc, timeout)
        return JobResult(self.proc.returncode, stdout, stderr, self.out, self.cwd, self.script)

