"""When each of this host's ranks' processes ended, and how, as `record` saw it (the job file's ``exits``).

A rank's log cannot say when its process ended: its last record may precede its death by up to a heartbeat (a
second), and nothing is written when SIGKILL or a launcher's SIGTERM ends it. So when one rank is killed and
torchrun stops the others a tenth of a second later, every log stops within the same second, and which rank went
first cannot be told from the logs. `record` is the launcher's parent, outside the job: a thread of its own
watches the ranks' processes (their pids are in the event logs' headers), which changes nothing in the job.

On Linux each process is watched through a pidfd, which becomes readable the moment the process ends; its
``/proc/<pid>/stat`` then still shows the zombie's exit code (the signal that killed it, or its exit status)
until the launcher reaps it, which a quick look usually beats. Each exit is written as an interval::

    {"rank": 0, "pid": 4242, "attempt": 0, "alive_ns": 1795313447406614332, "t_ns": 1795313447410251003,
     "signal": "SIGKILL", "status": null}

The process was seen alive at ``alive_ns`` (null: never seen alive before it was seen ended) and ended by
``t_ns``; ``signal`` is the signal that ended it, or ``status`` its exit status, both null where the launcher
reaped it first. Every look at the processes is one pass; when two processes are seen ended in different passes,
a pass lies between them in which the later one was still alive, so ``a.t_ns < b.alive_ns`` proves ``a`` ended
first, whatever the thread's scheduling; exits seen in one pass are not ordered.
"""

from __future__ import annotations

import glob
import os
import select
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from comm2perfetto import layout
from comm2perfetto.processes import stat_fields
from comm2perfetto.sources.event_log import read_header

__all__ = ["ExitWatcher", "exit_cause"]

LOOK_S = 0.1  # how often the processes are looked at without pidfds; and new ranks' logs looked for at first
# Listing the folder (shared by every node, on big jobs) is slower and slower once logs stop appearing in it:
# every 0.1 s until the first comes, at most every 5 s once the ranks run (torchrun's restarts add logs later).
MAX_DISCOVER_S = 5.0


@dataclass
class _Watched:
    rank: int
    pid: int
    attempt: int
    fd: int | None  # its pidfd (None: looked at in every pass)
    alive_ns: int | None = None  # when the latest look that found it alive began


def exit_cause(fields: list[bytes] | None) -> tuple[str | None, int | None]:
    """(signal name, exit status) from a zombie's ``/proc/<pid>/stat`` fields (``processes.parse_stat``; field 52,
    ``exit_code``, is a wait status); (None, None) when the process is no zombie, or gone, or the field is missing
    (Linux before 3.5).

    >>> from comm2perfetto.processes import parse_stat
    >>> exit_cause(parse_stat(b"42 (python) Z 1 " + b"0 " * 47 + b"9"))
    ('SIGKILL', None)
    >>> exit_cause(parse_stat(b"42 (python) Z 1 " + b"0 " * 47 + b"256"))
    (None, 1)
    """
    if not fields or fields[0] not in (b"Z", b"X") or len(fields) < 50:
        return None, None
    try:
        code = int(fields[49])
    except ValueError:
        return None, None
    if code & 0x7F:
        try:
            return signal.Signals(code & 0x7F).name, None
        except ValueError:
            return f"SIG{code & 0x7F}", None
    return None, (code >> 8) & 0xFF


class ExitWatcher:
    """Watches the processes of this host's ranks on a daemon thread of `record`; ``stop()`` takes a last look
    and leaves what was seen in ``exits`` (the job file's)."""

    def __init__(self, out_dir: str) -> None:
        self._out_dir = out_dir
        self._host = socket.gethostname()
        self._me = os.getpid()
        self._known: set[str] = set()  # event logs whose header was read
        self._watched: dict[int, _Watched] = {}  # by pid
        self._by_fd: dict[int, _Watched] = {}
        self._poller = select.poll() if hasattr(os, "pidfd_open") else None
        self._wake_r, self._wake_w = os.pipe()  # stop() wakes a thread waiting in poll
        if self._poller is not None:
            self._poller.register(self._wake_r, select.POLLIN)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="comm2perfetto-exits", daemon=True)
        self.exits: list[dict[str, Any]] = []

    def start(self) -> None:
        if os.path.isdir("/proc/self"):  # elsewhere diagnose orders deaths by the logs alone
            self._thread.start()

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        os.write(self._wake_w, b"x")
        if self._thread.is_alive():
            self._thread.join()
            self._pass(0)
        for fd in [*self._by_fd, self._wake_r, self._wake_w]:
            os.close(fd)
        self._by_fd.clear()

    def _run(self) -> None:
        discover_s, next_discovery, ended = LOOK_S, 0.0, False
        try:
            while not self._stop.is_set():
                if time.monotonic() >= next_discovery:
                    found = self._discover()
                    discover_s = LOOK_S if found or not self._known else min(2 * discover_s, MAX_DISCOVER_S)
                    next_discovery = time.monotonic() + discover_s
                # After an exit, one more pass at once: it separates that exit from the next (see the module).
                wait = 0.0 if ended else LOOK_S if self._poller is None else next_discovery - time.monotonic()
                ended = self._pass(max(0.0, wait))
        except Exception as exc:  # a bug here must not take record (and the job's signals) down
            print(f"comm2perfetto: watching the ranks' processes stopped after an internal error: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)

    def _pass(self, wait_s: float) -> bool:
        """One look at the watched processes (with pidfds: waiting up to ``wait_s`` for one to end); whether
        any was seen ended."""
        start = time.time_ns()
        watched_now = list(self._watched.values())
        if self._poller is not None:
            ready = [self._by_fd[fd] for fd, _ in self._poller.poll(wait_s * 1000) if fd in self._by_fd]
            stats = {w.pid: _fields(w.pid) for w in ready}
        else:
            self._stop.wait(wait_s)
            start = time.time_ns()
            stats = {w.pid: _fields(w.pid) for w in watched_now}
            ready = [w for w in watched_now if _ended(stats[w.pid])]
        seen = time.time_ns()
        for w in ready:
            signame, status = exit_cause(stats[w.pid])
            self.exits.append({"rank": w.rank, "pid": w.pid, "attempt": w.attempt, "alive_ns": w.alive_ns,
                               "t_ns": seen, "signal": signame, "status": status})
            self._forget(w)
        for w in watched_now:
            if w not in ready:
                w.alive_ns = start
        return bool(ready)

    def _forget(self, w: _Watched) -> None:
        del self._watched[w.pid]
        if w.fd is not None and self._poller is not None:
            self._poller.unregister(w.fd)
            del self._by_fd[w.fd]
            os.close(w.fd)

    def _discover(self) -> bool:
        """Start watching the ranks whose event logs appeared (every torchrun attempt's), when their process runs
        on this host under `record`; whether a new log was found."""
        found = False
        for attempt, folder in layout.attempt_folders(self._out_dir).items():
            for path in glob.glob(os.path.join(folder, layout.EVENT_LOG_GLOB)):
                if path in self._known:
                    continue
                header = read_header(path)
                if header is None:
                    continue  # not written whole yet: looked at again next time
                self._known.add(path)
                found = True
                pid, rank = header.get("pid"), header.get("rank")
                if header.get("host") != self._host or not isinstance(pid, int) or not isinstance(rank, int) \
                        or pid in self._watched or not _descends_from(pid, self._me):
                    continue
                self._watch(_Watched(rank, pid, attempt, None))
        return found

    def _watch(self, w: _Watched) -> None:
        looked = time.time_ns()
        if not _ended(_fields(w.pid)):
            w.alive_ns = looked
        if self._poller is not None:
            try:
                w.fd = os.pidfd_open(w.pid)
            except ProcessLookupError:
                return  # gone already: when, nobody saw
            except OSError:  # a kernel before 5.3 (ENOSYS), or a sandbox that forbids it: look at /proc instead
                self._scan_instead()
            else:
                self._poller.register(w.fd, select.POLLIN)
                self._by_fd[w.fd] = w
        self._watched[w.pid] = w

    def _scan_instead(self) -> None:
        """Without pidfds: every watched process is looked at in each pass, every ``LOOK_S``."""
        for fd, w in self._by_fd.items():
            os.close(fd)
            w.fd = None
        self._by_fd.clear()
        self._poller = None


def _fields(pid: int) -> list[bytes] | None:
    try:
        return stat_fields(pid)
    except OSError:
        return None  # reaped already


def _ended(fields: list[bytes] | None) -> bool:
    return fields is None or fields[:1] in ([b"Z"], [b"X"])


def _descends_from(pid: int, ancestor: int) -> bool:
    """Whether ``pid`` is a descendant of ``ancestor`` (``/proc``'s parent links): a rank of this job, not a
    process of another host that shares this one's name and the folder."""
    for _ in range(64):
        fields = _fields(pid)
        try:
            pid = int(fields[1]) if fields is not None else 0
        except (IndexError, ValueError):
            return False
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False
