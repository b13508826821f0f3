"""Run a job under ``comm2perfetto record``: with the recorder's boot code on its ``PYTHONPATH`` and its
configuration in the environment (``child_environment``), in its own session and process group with every
signal to ``record`` forwarded to the whole group (``run_forwarding_signals``), and a job file saying how it
ended (``write_job_file``, read back by ``sources.read``)::

    {"format": "comm2perfetto-job", "version": 1, "run_id": "...", "command": ["torchrun", ...],
     "host": "node0", "pid": 4242, "started_ns": ..., "ended_ns": ..., "exit_status": 0, "signal": null, ...}

Never imports torch: this runs in ``record``'s own process, which only starts the job.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from comm2perfetto import layout
from comm2perfetto.errors import OptionError
from comm2perfetto.record import flight
from comm2perfetto.record.config import RecordConfig

__all__ = ["GRACE_S", "JobEnding", "child_environment", "run_forwarding_signals", "write_job_file"]

BOOT_DIR = str(Path(__file__).resolve().parent / "record" / "_boot")


def child_environment(config: RecordConfig, base: dict[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """The environment every process of the job starts with, and warnings for the user."""
    env = dict(os.environ if base is None else base)
    env.update(config.to_env())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (BOOT_DIR, env.get("PYTHONPATH", "")) if p)
    warnings = flight.prepare_environment(env, config.fr_buffer, config.out_dir, config.gpu_timing)
    return env, warnings


# After forwarding a signal, how long the job's processes get to end before the next, harder one.
GRACE_S = 5.0


@dataclass
class JobEnding:
    """How the job ended: its exit status and the signal record forwarded to it, if any (with when)."""

    status: int
    signal: str | None = None
    signal_ns: int | None = None
    killed_leftovers: bool = False


def run_forwarding_signals(command: list[str], env: dict[str, str],
                           on_first_signal: Callable[[], None] | None = None) -> JobEnding:
    """Run the job in its own session and process group; a signal to us goes to the whole group.

    Signalling the group, not only the launcher, reaches every rank also when the launcher is a shell script
    (``bash -c 'python a & python b & wait'``: a shell dies of SIGTERM and leaves its children running, and
    its background children ignore SIGINT). Once a signal came, the group gets SIGTERM after ``GRACE_S``
    and SIGKILL after twice that, and we wait until none of its processes is left. ``on_first_signal`` runs
    before the first signal is forwarded (to see which ranks are stopped before anything kills them).
    """
    try:
        child = subprocess.Popen(command, env=env, start_new_session=True)
    except OSError as exc:
        raise OptionError(f"cannot start {command[0]}: {exc.strerror}") from None
    ending = JobEnding(status=0)

    def forward(signum: int, _frame: object) -> None:
        if ending.signal is None:
            ending.signal, ending.signal_ns = signal.Signals(signum).name, time.time_ns()
            if on_first_signal is not None:
                try:
                    on_first_signal()
                except Exception:  # looking is an extra: the signal goes on to the job regardless
                    pass
        _signal_group(child.pid, signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        returncode = _wait_escalating(child, ending)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    ending.status = returncode if returncode >= 0 else 128 - returncode
    return ending


def _wait_escalating(child: subprocess.Popen, ending: JobEnding) -> int:
    """The launcher's exit status, once the job is over. Without a signal, that is when the launcher ends. Once
    a signal was forwarded, it is when none of the job's group is left: the group gets SIGTERM ``GRACE_S``
    after the signal and SIGKILL ``GRACE_S`` later, whether the launcher lives on (a shell in ``wait`` may
    outlive a SIGINT its background children ignore) or left ranks behind; one more ``GRACE_S`` and we stop
    waiting for what even SIGKILL did not end (a process stuck in the kernel)."""
    harder = [signal.SIGTERM, signal.SIGKILL, None]
    returncode: int | None = None
    while True:
        if returncode is None:
            try:
                returncode = child.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
        else:  # the launcher ended after a signal: poll what is left of its group
            time.sleep(0.05)
        if returncode is not None and (ending.signal_ns is None or not _signal_group(child.pid, 0)):
            return returncode
        if ending.signal_ns is None or (time.time_ns() - ending.signal_ns) / 1e9 < GRACE_S * (4 - len(harder)):
            continue
        harder_signal = harder.pop(0)
        if harder_signal is None:
            return child.wait() if returncode is None else returncode
        ending.killed_leftovers = _signal_group(child.pid, harder_signal) or ending.killed_leftovers


def _signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to the job's process group (0: only ask whether any is left); False when none of its
    processes is left."""
    try:
        os.killpg(pgid, signum)
        return True
    except ProcessLookupError:
        return False


def write_job_file(config: RecordConfig, command: list[str], started: int, ending: JobEnding,
                    probes: list[dict] | None = None, exits: list[dict] | None = None) -> None:
    host, pid = socket.gethostname(), os.getpid()
    job: dict[str, Any] = {
        "format": "comm2perfetto-job", "version": 1, "run_id": config.run_id, "command": command,
        "host": host, "pid": pid,
        "cwd": os.getcwd(), "started_ns": started, "ended_ns": time.time_ns(), "exit_status": ending.status,
        "signal": ending.signal, "signal_ns": ending.signal_ns, "killed_leftovers": ending.killed_leftovers,
        "probes": probes or [], "exits": exits or [],
    }
    with open(os.path.join(config.out_dir, layout.job_file(host, pid)), "wb") as f:
        f.write(orjson.dumps(job, option=orjson.OPT_INDENT_2))
