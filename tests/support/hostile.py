"""Hostile inputs made from a real recording, and a way to run the CLI on them within bounds.

``run_bounded`` runs one ``comm2perfetto`` command in a child process under an address-space limit
(``RLIMIT_AS``) and a wall-clock limit, and returns its exit status, output, time and peak memory (what
support/cli.py's runners, which have no limits, cannot tell). Two ways:

- ``fresh=True``: a new interpreter (``python -m comm2perfetto``), what a user runs;
- default: a fork of this process, which has imported comm2perfetto already (a few ms instead of 0.2 s a
  run, so the property tests can afford hundreds of runs). The child gets its own limits, runs
  ``cli.main`` and exits with its status; an exception escaping ``main`` is printed as the interpreter would
  (a traceback, status 1), so a test sees exactly what a user would.

The builders below copy a recording and damage it the way files copied off a cluster are damaged.
"""

from __future__ import annotations

import gzip
import os
import pickle
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from support.cli import COMMAND, run_cli

RECORDING = Path(__file__).resolve().parents[1] / "data" / "recording" / "subgroups"
SRC = Path(__file__).resolve().parents[2] / "src"
MEMORY_LIMIT = 1 << 30  # address space a run may add to what it starts with
TIME_LIMIT_S = 60.0


@dataclass
class CliRun:
    argv: list[str]
    rc: int | None  # None: killed at the time limit
    out: str
    err: str
    secs: float
    peak_rss_bytes: int  # of the child process (a fork's counts the pages it shares with this process)

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.err

    def explain(self) -> str:
        return f"comm2perfetto {' '.join(self.argv)} -> rc {self.rc} in {self.secs:.1f}s\n{self.err[-3000:]}"


def _limit_memory(extra: int) -> None:
    with open("/proc/self/status") as fh:
        vm = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + extra, vm + extra))


def run_bounded(argv: list[str], *, fresh: bool = False, memory: int = MEMORY_LIMIT,
                timeout: float = TIME_LIMIT_S) -> CliRun:
    """Run ``comm2perfetto ARGV`` in a bounded child process (see the module docstring)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        if fresh:
            env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH") or str(SRC))  # a given one wins
            proc = subprocess.Popen([*COMMAND, *argv], stdout=out, stderr=err,
                                    stdin=subprocess.DEVNULL, env=env, preexec_fn=lambda: _limit_memory(memory))
            pid = proc.pid
        else:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the child: never returns
                _child(argv, out.fileno(), err.fileno(), memory)
        rc, usage = _wait(pid, timeout)
        secs = time.monotonic() - start
        if fresh:
            proc.returncode = rc if rc is not None else -9  # reaped already
        out.seek(0)
        err.seek(0)
        return CliRun(list(argv), rc, out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                      secs, usage.ru_maxrss * 1024 if usage else 0)


def warm_up(folder: Path, out: Path) -> None:
    """Run the three commands once in this process, so forked runs find their modules imported (a fork then
    costs tens of milliseconds, not the 0.3 s of importing the writers)."""
    import gc

    for argv in (["diagnose", folder], ["merge", folder, "-o", out], ["report", folder]):
        run_cli(*argv)
    gc.enable()  # the commands switch the cyclic GC off for their short lives


def _child(argv: list[str], out_fd: int, err_fd: int, memory: int) -> None:
    status = 1
    try:
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        # pytest replaces sys.stdout/stderr with its capture objects: write to the real descriptors instead
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _limit_memory(memory)
        from comm2perfetto.cli import main

        try:
            status = main(argv)
        except SystemExit as exc:  # argparse
            status = exc.code if isinstance(exc.code, int) else 2
        except BaseException:
            traceback.print_exc()
            status = 1
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status)


def _wait(pid: int, timeout: float) -> tuple[int | None, Any]:
    deadline = time.monotonic() + timeout
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), usage
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            return None, usage
        time.sleep(0.005)


# --- builders ----------------------------------------------------------------------------------------------


def copy_recording(dest: Path, source: Path = RECORDING) -> Path:
    shutil.copytree(source, dest)
    return dest


def load_dump(path: Path) -> dict[str, Any]:
    with open(path, "rb") as fh:
        return pickle.load(fh)


def save_dump(path: Path, doc: Any) -> None:
    path.write_bytes(pickle.dumps(doc, protocol=2))


def event_lines(path: Path) -> list[bytes]:
    return path.read_bytes().rstrip(b"\0").split(b"\n")


def set_header(path: Path, **fields: Any) -> None:
    lines = event_lines(path)
    header = orjson.loads(lines[0])
    header.update(fields)
    lines[0] = orjson.dumps(header)
    path.write_bytes(b"\n".join(lines))


def edit_entries(folder: Path, rank: int, **fields: Any) -> None:
    """Set ``fields`` on every Flight Recorder entry of ``rank``."""
    for path in sorted(folder.glob(f"rank{rank}.fr.*.pkl")):
        doc = load_dump(path)
        for e in doc["entries"]:
            e.update(fields)
        save_dump(path, doc)


def huge_pg_config(folder: Path, ranks: int) -> None:
    """Every dump's default group lists ``ranks`` ranks (FR writes the list as one string)."""
    text = "[" + ", ".join(map(str, range(ranks))) + "]"
    for path in sorted(folder.glob("rank*.fr.*.pkl")):
        doc = load_dump(path)
        doc["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": text}}
        save_dump(path, doc)


def gzip_bomb(path: Path, inflated: int) -> None:
    """A gzip file that starts like a pickled dump and inflates to ``inflated`` bytes (mostly zeros)."""
    comp = zlib.compressobj(1, zlib.DEFLATED, 31)
    chunk = bytes(1 << 24)
    with open(path, "wb") as fh:
        fh.write(comp.compress(b"\x80\x02}q\x00"))
        left = inflated
        while left > 0:
            fh.write(comp.compress(chunk[:min(left, len(chunk))]))
            left -= len(chunk)
        fh.write(comp.flush())


def garbage_after_header(path: Path, lines: int) -> None:
    head = event_lines(path)[0]
    body = b"\n".join(b"%d garbage {]" % i for i in range(lines))
    path.write_bytes(head + b"\n" + body + b"\n")


def gzip_file(path: Path) -> Path:
    out = path.with_name(path.name + ".gz")
    out.write_bytes(gzip.compress(path.read_bytes()))
    path.unlink()
    return out
