"""What the recorder saw at stalls (``k`` records and the stacks files), as diagnose reads them. No torch."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from comm2perfetto.job import Job

if TYPE_CHECKING:
    from comm2perfetto.sources.event_log import Call, Stall

MAX_STACK_FRAMES = 12


def stall_times(job: Job) -> list[int]:
    """When the recorder detected stalls, on any rank (aligned to rank 0), earliest first."""
    return sorted(st.t_ns for log in job.logs.values() for st in log.stalls)


def open_stall(job: Job) -> tuple[int, Stall, Call] | None:
    """The earliest stall a rank detected on a call of its own that never returned (the rank, the stall, the
    call): a hang the data saw, whatever else the data shows or fails to show."""
    found: list[tuple[int, int, Stall, Call]] = []
    for rank, log in job.logs.items():
        calls = {c.cid: c for c in log.calls} if log.stalls else {}
        for st in log.stalls:
            call = calls.get(st.cid) if st.cid is not None else None
            if call is not None and call.t_return_ns is None:
                found.append((st.t_ns, rank, st, call))
    if not found:
        return None
    _, rank, st, call = min(found, key=lambda item: (item[0], item[1]))
    return rank, st, call


def stall_stack(job: Job, rank: int) -> tuple[str, ...]:
    """The rank's main Python stack from its latest stall-stacks file, innermost first: ``train.py:41 step``."""
    stacks = job.stall_stacks.get(rank)
    main = stacks.main_thread() if stacks is not None else None
    if main is None:
        return ()
    frames = main.frames[:MAX_STACK_FRAMES]
    return tuple(f"{os.path.basename(file)}:{line} {func}".rstrip() for file, line, func in frames)
