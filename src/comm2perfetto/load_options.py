"""What to read of a job and how: ``LoadOptions``, the one value ``match.load_job`` takes, with a preset per
product so that a command says what it needs in one word and changes only what its options change::

    job = load_job(args.paths, replace(DIAGNOSE, attempt=args.attempt, workers=args.jobs))

Flight Recorder dumps, recorder logs, stall stacks and job files are always read; what varies is how much of
the profiler traces (``Traces``), whether the call stacks are read now or on demand, and the profile unions
``report`` measures. Never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from comm2perfetto.strenum import StrEnum

__all__ = ["COMPARE", "DIAGNOSE", "MERGE", "REPORT", "LoadOptions", "Traces"]


class Traces(StrEnum):
    """How much of the profiler (Kineto) traces is read."""

    NONE = "none"  # left out (--no-profiler); profiler traces alone are then an error
    LISTED = "listed"  # ranked and listed (``RankInfo.kineto_files``), not read (``compact`` copies them)
    COLLECTIVES = "collectives"  # their communication events, in worker processes: what the matching joins
    EVENTS = "events"  # every event (``Job.traces``: merge draws them), in this process


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """What ``match.load_job`` reads and how. The defaults read everything: every trace event, the stacks now."""

    traces: Traces = Traces.EVENTS
    # Also reduce each rank's traces, where they are read, to the unions of compute, communication and memory
    # time ``report`` measures (``Job.profiles``), in the same reading.
    profiles: bool = False
    # Flight Recorder's call stacks now (merge draws them all), or on demand (``Job.stack_of``: diagnose shows a
    # handful; a quarter of the load time on big jobs).
    stacks: bool = True
    align: bool = True  # put every rank's times on rank 0's clock (False: each rank's own; merge --no-align)
    # The profiles as Holistic Trace Analysis reads them (report --hta-rounding, --hta-scope): events rounded
    # inward to whole microseconds; and only the kernels HTA's overlap counts (the scope implies the rounding).
    hta_rounding: bool = False
    hta_scope: bool = False
    attempt: int | None = None  # of a job torchrun restarted: which attempt (default the last)
    force: bool = False  # read files that look like several jobs together (a note says so) instead of refusing
    sample: bool = False  # the ranks with data are a sample of the job (``Job.sampled``; --sample)
    # The ranks of profiler traces that say neither in their distributedInfo nor in their name (--trace-rank).
    trace_ranks: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    workers: int | None = None  # processes reading the ranks' files (--jobs); None: every core from 32 ranks on
    # ``progress(done, total)`` as the ranks' dumps are read, ``trace_progress`` as their traces are (in workers).
    progress: Callable[[int, int], None] | None = field(default=None, compare=False, repr=False)
    trace_progress: Callable[[int, int], None] | None = field(default=None, compare=False, repr=False)

    @property
    def whole_us(self) -> bool:
        """Round the profile's events inward to whole microseconds, as HTA does."""
        return self.hta_rounding or self.hta_scope

    def for_attempt(self, attempt: int) -> LoadOptions:
        """How another attempt of the job is read to say how it ended: its dumps and logs alone, no stacks."""
        return LoadOptions(traces=Traces.NONE, stacks=False, attempt=attempt, force=self.force,
                           trace_ranks=self.trace_ranks)


DIAGNOSE = LoadOptions(traces=Traces.COLLECTIVES, stacks=False)
REPORT = LoadOptions(traces=Traces.COLLECTIVES, profiles=True, stacks=False)
MERGE = LoadOptions()  # everything: every event, the stacks now (the default of every loader)
COMPARE = REPORT  # each side is read as report reads it
