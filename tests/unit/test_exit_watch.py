"""`record`'s watch of its ranks' processes (exit_watch): real child processes, ended by a signal or an exit
status, each seen with how it ended and in what order; processes that are not the job's are left alone."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from comm2perfetto.exit_watch import ExitWatcher, exit_cause
from comm2perfetto.processes import parse_stat

# Waits for a line on stdin, then exits with that status (SIGINT would not do: a job started in the background
# of a non-interactive shell, as CI may be, ignores it, and so do its children).
WAITING = [sys.executable, "-c", "import sys; sys.exit(int(sys.stdin.readline() or 0))"]


def _header(folder, rank: int, pid: int, host: str | None = None) -> None:
    (folder / f"rank{rank}.events.jsonl").write_text(json.dumps(
        {"kind": "header", "format": "comm2perfetto-events", "version": 1, "rank": rank, "world_size": 4,
         "host": host or socket.gethostname(), "pid": pid}) + "\n")


def _until(predicate, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def _no_pidfd(_pid: int) -> int:
    raise OSError(38, "Function not implemented")  # ENOSYS: a kernel before 5.3


def _seen_alive_after(watcher: ExitWatcher, pid: int) -> bool:
    """The watcher looked at ``pid`` again, and found it alive, after the latest end it saw: an end of ``pid`` from
    now on is known to come after that one."""
    w = watcher._watched.get(pid)
    return w is not None and w.alive_ns is not None and w.alive_ns > watcher.exits[-1]["t_ns"]


@pytest.fixture(params=["pidfd", "scan", "pidfd-refused"])
def watcher(request, tmp_path, monkeypatch):
    if request.param != "scan" and not hasattr(os, "pidfd_open"):
        pytest.skip("this Python has no os.pidfd_open")
    if request.param == "scan":
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    if request.param == "pidfd-refused":
        monkeypatch.setattr(os, "pidfd_open", _no_pidfd)
    w = ExitWatcher(str(tmp_path))
    yield w
    w.stop()


def test_each_end_is_seen_with_its_cause_and_in_its_order(tmp_path, watcher):
    procs = [subprocess.Popen(WAITING, stdin=subprocess.PIPE) for _ in range(3)]
    try:
        for rank, p in enumerate(procs):
            _header(tmp_path, rank, p.pid)
        watcher.start()
        time.sleep(0.3)  # found and seen alive
        procs[0].kill()
        _until(lambda: len(watcher.exits) == 1)  # we reap nothing before it looked: the zombie says how
        _until(lambda: _seen_alive_after(watcher, procs[1].pid))
        procs[1].send_signal(signal.SIGTERM)
        _until(lambda: len(watcher.exits) == 2)
        _until(lambda: _seen_alive_after(watcher, procs[2].pid))
        procs[2].stdin.write(b"3\n")  # type: ignore[union-attr]  (it exits with status 3)
        procs[2].stdin.flush()  # type: ignore[union-attr]
        _until(lambda: len(watcher.exits) == 3)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    first, second, third = watcher.exits
    assert [(e["rank"], e["pid"], e["attempt"], e["signal"]) for e in watcher.exits[:2]] == [
        (0, procs[0].pid, 0, "SIGKILL"), (1, procs[1].pid, 0, "SIGTERM")]
    assert (third["rank"], third["signal"], third["status"]) == (2, None, 3)
    # Each later end was seen alive after the earlier one was seen ended: their order is proven.
    assert first["t_ns"] < second["alive_ns"] <= second["t_ns"] < third["alive_ns"] <= third["t_ns"]


def test_a_rank_whose_log_comes_late_is_watched_at_once(tmp_path, watcher):
    """The ranks import torch for seconds before their logs appear: the folder is looked at often until then."""
    watcher.start()
    time.sleep(1.5)  # no log yet
    p = subprocess.Popen(WAITING, stdin=subprocess.PIPE)
    try:
        _header(tmp_path, 0, p.pid)
        _until(lambda: p.pid in watcher._watched, timeout_s=0.5)
        p.kill()
        _until(lambda: len(watcher.exits) == 1)
    finally:
        p.kill()
        p.wait()
    assert (watcher.exits[0]["rank"], watcher.exits[0]["signal"]) == (0, "SIGKILL")


def test_an_end_the_launcher_reaped_first_is_seen_without_its_cause(tmp_path, watcher):
    p = subprocess.Popen(WAITING, stdin=subprocess.PIPE)
    _header(tmp_path, 0, p.pid)
    watcher._discover()  # one look at a time, from this thread: the process dies and is reaped between two
    watcher._pass(0)
    p.kill()
    p.wait()
    watcher._pass(0)
    (seen,) = watcher.exits
    assert (seen["rank"], seen["signal"], seen["status"]) == (0, None, None)
    assert seen["alive_ns"] is not None and seen["alive_ns"] < seen["t_ns"]


def test_processes_that_are_not_the_jobs_are_left_alone(tmp_path, watcher):
    _header(tmp_path, 0, 1)  # init: no descendant of ours
    _header(tmp_path, 1, os.getpid(), host="another-host")  # a log of another node sharing the folder
    (tmp_path / "rank2.events.jsonl").write_text('{"kind": "head')  # not written whole yet
    watcher.start()
    time.sleep(0.3)
    watcher.stop()
    assert watcher.exits == [] and watcher._watched == {}


def test_the_exit_code_of_a_zombie_is_read_as_a_wait_status():
    def cause(line: bytes):
        return exit_cause(parse_stat(line))

    fields = b"42 (a (b) c) Z 1 " + b"0 " * 47
    assert cause(fields + b"9") == ("SIGKILL", None)
    assert cause(fields + b"15") == ("SIGTERM", None)
    assert cause(fields + b"134") == ("SIGABRT", None)  # 6 | 0x80: it dumped core
    assert cause(fields + b"768") == (None, 3)
    assert cause(b"42 (python) S 1 " + b"0 " * 47 + b"9") == (None, None)  # alive: no exit code yet
    assert cause(b"42 (python) Z 1 0 0") == (None, None)  # a kernel without the field
    assert cause(b"") == (None, None)
    assert exit_cause(None) == (None, None)  # reaped before it was looked at
