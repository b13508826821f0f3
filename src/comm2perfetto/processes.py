"""What the reader's host can see of a rank's process: whether it exists, is stopped, and burns CPU. From
``/proc`` on Linux (elsewhere, whether it can be signalled). For `record`'s probes at a stall and for diagnose
run while the job still runs. No torch.
"""

from __future__ import annotations

import os
import time

__all__ = ["CPU_SAMPLE_S", "cpu_time_growth", "parse_stat", "process_state", "stat_fields"]

CPU_SAMPLE_S = 0.2


def parse_stat(data: bytes) -> list[bytes]:
    """The fields of a ``/proc/<pid>/stat`` line after the command name (which may hold spaces and parentheses):
    the first is the state, field 3 of proc(5).

    >>> parse_stat(b"42 (a (b) c) Z 1 42")
    [b'Z', b'1', b'42']
    """
    return data.rsplit(b")", 1)[-1].split()


def stat_fields(pid: int) -> list[bytes]:
    """``parse_stat`` of the process's ``/proc/<pid>/stat``; OSError where it cannot be read (FileNotFoundError:
    no such process, or no ``/proc``)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return parse_stat(f.read())


def cpu_time_growth(pid: int, sample_s: float = CPU_SAMPLE_S) -> float | None:
    """Seconds of CPU (user + system) the process used over ``sample_s`` (``/proc/<pid>/stat``); None where it
    cannot be read (not Linux, gone)."""
    def cpu() -> float | None:
        try:
            fields = stat_fields(pid)
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return None
    before = cpu()
    time.sleep(sample_s)
    after = cpu()
    return None if before is None or after is None else max(0.0, after - before)


def process_state(pid: int) -> str:
    """``stopped`` (SIGSTOP or a debugger: state T), ``running`` (it exists), or ``gone`` (it does not, or a
    zombie): from ``/proc/<pid>/stat`` on Linux, else whether it can be signalled."""
    try:
        state = stat_fields(pid)[0]
    except FileNotFoundError:
        return "gone"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "gone"
        except PermissionError:
            return "running"
        return "running"
    return "stopped" if state in (b"T", b"t") else "gone" if state in (b"Z", b"X") else "running"
