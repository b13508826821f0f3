"""What the recorder's parts see of it: the protocols they are typed against instead of the Recorder class.

recorder.Recorder satisfies them (the type checker proves it where session.py hands the recorder to each
part). The parts (watchdog, live, flight, profiler, context, nvtx, state) import this module for the type
checker only, and the recorder not at all; a test hands them a small stand-in instead, e.g. ``LiveVerdict`` a
class with a ``rank`` alone.

- ``RankLog``: who this rank is and where its records go; enough for the step counter and Flight Recorder's
  dumps.
- ``RecorderView``: also its steps, groups, calls in flight and Flight Recorder: what the watchdog, the live
  verdict, the profiler capture and the readers of ``state.recorder`` use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from comm2perfetto.record.log import EventLog


class RankLog(Protocol):
    rank: int

    @property
    def log(self) -> EventLog: ...

    def warn(self, message: str) -> None:
        """A ``w`` record in the log."""

    def fault(self, exc: BaseException) -> None:
        """Disable recording on this rank after an internal error; training goes on."""


class Steps(Protocol):
    """The step counter (context.StepCounter)."""

    current: int
    listeners: list[Callable[[int], None]]  # called with the new step number at each boundary

    def advance(self, source: str) -> None: ...

    def on_profiler_step(self) -> None: ...


class Group(Protocol):
    """A process group the recorder declared (a ``g`` record)."""

    name: str  # c10d's group name
    desc: str
    ranks: list[int]
    p2p_consumed: int  # the group's sequence numbers that its point-to-point ops took on gloo
    cpu: bool  # every backend of the group runs on the CPU: a synchronous call's return is its completion

    @property
    def seq_counter(self) -> Callable[[], int] | None: ...


class FlightView(Protocol):
    """The rank's Flight Recorder dumps (flight.FlightRecorderDumps), as the watchdog reads them."""

    def maybe_dump(self) -> None: ...

    def unfinished(self, quiet_ns: int = 0) -> dict[tuple[str, str, str], int] | None: ...

    def since(self, key: tuple[str, str, str], seq: int) -> int | None: ...

    def active_entry(self, kind: str, pg_id: str, seq: int, counter: str = "coll") -> tuple[str, str, str] | None:
        ...


class RecorderView(RankLog, Protocol):
    @property
    def steps(self) -> Steps: ...

    @property
    def flight(self) -> FlightView | None: ...

    @property
    def clock(self) -> tuple[int, int] | None:
        """This rank's start-up clock measurement (clock.py), ``(offset_ns, rtt_ns)``, once it reported."""
        ...

    @property
    def internal_roots(self) -> tuple[str, ...]:
        """Path prefixes of frames that are not user code."""
        ...

    def in_flight(self) -> list[list]:
        """The ``b`` records of the calls not completed, oldest first."""
        ...

    @property
    def arg_numel(self) -> dict[int, tuple[int, tuple[str, ...]]]:
        """Argument signature id (a `b` record's last field) -> (elements, dtypes) of the input tensors."""
        ...

    @property
    def failed_calls(self) -> set[int]:
        """The cids of calls that raised (a timeout, a broken connection): no longer in flight, not completed."""
        ...

    @property
    def uncaught(self) -> bool:
        """An uncaught exception is ending the rank (``sys.excepthook`` ran)."""
        ...

    @property
    def p2p_counts(self) -> dict[tuple[int, str, int], int]:
        """Sends and receives issued: (gid, "send"/"recv", peer) -> how many."""
        ...

    def p2p_works_pending(self) -> dict[int, list[int]]:
        """Sends and receives that returned and whose work is not done: cid -> each op's index to its peer."""
        ...

    def groups(self) -> Sequence[Group]: ...

    def declare_all_groups(self) -> None: ...

    def group_name(self, gid: int) -> str: ...

    def completed_on_cpu(self, group_name: str, seq: int) -> bool: ...

    def dump_flight_recorder(self, reason: str, wait: bool = True) -> None: ...

    def name_thread(self, tid: int) -> None: ...
