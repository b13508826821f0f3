"""What record's watchers share (stall_watch.py, window_watch.py): a thread that polls the recording folder
(``Poller``), and the user's command run at a live event (``--on-stall``, ``--on-straggler``), never holding up
the job (``HookRunner``).

Events run one after the other on a thread of their own (a stall is announced before its resolution, a
straggler's start before its end), so a slow command never holds up the watching. Each run gets the event's
JSON on stdin and ``COMM2PERFETTO_EVENT`` (plus what the caller adds) in its environment, runs in a session of
its own, is killed with its children after the timeout, and writes only to its log file.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable

ENV_EVENT = "COMM2PERFETTO_EVENT"


class HookRunner:
    """Runs ``command`` (a shell command line) once per ``submit``; ``stop()`` waits for the runs still queued,
    each at most ``timeout_s``. ``option`` names the command in messages (``--on-stall``), ``say`` prints one."""

    def __init__(self, command: str, timeout_s: float, log_path: str, option: str, say: Callable[[str], None]) -> None:
        self._command = command
        self._timeout_s = timeout_s
        self._log_path = log_path
        self._option = option
        self._say = say
        self._queue: queue.Queue[tuple[str, bytes, dict[str, str]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def submit(self, event: str, data: bytes, env: dict[str, str] | None = None) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run_all, name=f"comm2perfetto{self._option}", daemon=True)
            self._thread.start()
        self._queue.put((event, data, env or {}))

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()

    def _run_all(self) -> None:
        while (item := self._queue.get()) is not None:
            self._run(*item)

    def _run(self, event: str, data: bytes, extra: dict[str, str]) -> None:
        """Run the command with the event on stdin; kill it (and its children) after the timeout."""
        os.makedirs(os.path.dirname(self._log_path), exist_ok=True)
        env = dict(os.environ, **extra, **{ENV_EVENT: event})
        with open(self._log_path, "ab") as log:
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {event}: {self._command}\n".encode())
            log.flush()
            try:
                proc = subprocess.Popen(self._command, shell=True, stdin=subprocess.PIPE, stdout=log, stderr=log,
                                        env=env, start_new_session=True)
            except OSError as exc:
                self._say(f"{self._option} could not start: {exc}")
                return
            try:
                assert proc.stdin is not None  # stdin=PIPE
                proc.stdin.write(data)
                proc.stdin.close()
            except OSError:  # the command did not read its input
                pass
            try:
                status = proc.wait(timeout=self._timeout_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
                self._say(f"{self._option} command killed after {self._timeout_s:g} s (see {self._log_path})")
                return
        if status != 0:
            self._say(f"{self._option} command exited with status {status} (see {self._log_path})")


class Poller:
    """A watcher in record's own process: ``poll()`` every ``poll_s`` seconds on a daemon thread; ``stop()`` ends
    it, takes a last look (the job may have written as it ended) and waits for the commands still queued, each
    at most its timeout. Subclasses set ``_hooks`` and define ``poll`` and ``_say``; ``what`` names the watching
    in the one line an internal error ends it with."""

    def __init__(self, what: str, thread_name: str, poll_s: float) -> None:
        self._what = what
        self._poll_s = poll_s
        self._hooks: HookRunner | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.poll()
        if self._hooks is not None:
            self._hooks.stop()

    def poll(self) -> None:
        raise NotImplementedError

    def _say(self, text: str) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                self.poll()
            except Exception as exc:  # a bug here must not take record (and the job's signals) down
                self._say(f"{self._what} stopped after an internal error: {type(exc).__name__}: {exc}")
                return
