"""What the recorder saw at stalls (``k`` records and the stacks files), as diagnose reads them. No torch."""

from __future__ import annotations

import os

from comm2perfetto.model import Job

MAX_STACK_FRAMES = 12


def stall_times(job: Job) -> list[int]:
    """When the recorder detected stalls, on any rank (aligned to rank 0), earliest first."""
    return sorted(st.t_ns for log in job.logs.values() for st in log.stalls)


def stall_stack(job: Job, rank: int) -> tuple[str, ...]:
    """The rank's main Python stack from its latest stall-stacks file, innermost first: ``train.py:41 step``."""
    stacks = job.stall_stacks.get(rank)
    main = stacks.main_thread() if stacks is not None else None
    if main is None:
        return ()
    frames = main.frames[:MAX_STACK_FRAMES]
    return tuple(f"{os.path.basename(file)}:{line} {func}".rstrip() for file, line, func in frames)
