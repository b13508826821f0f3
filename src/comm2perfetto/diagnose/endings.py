"""How each rank's process ended, from what its recorder log says (a pure function over a ``Job``).

The evidence, per rank (docs/log-format.md): the closing ``z`` record, the ``u`` records the recorder writes
when a signal or an uncaught exception ends the process, failed calls (``x``), the ``h`` heartbeats, and,
for an unclosed log written on the reading host, whether its process still runs (``RankInfo.alive``)::

    ["u", 1795616108477091014, "signal", "SIGINT"]
    ["u", 1795616109844196322, "exception", "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer"]
    ["h", 1795616109000000000]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from comm2perfetto.job import Job, RankExit

RUNNING = "running"  # the process still runs (or wrote a heartbeat moments ago)
EXITED = "exited"  # closed its log normally
SIGNALLED = "signal"  # a SIGINT/SIGTERM (or the KeyboardInterrupt it raises) ended it
PEER_LOST = "peer_lost"  # failed because a peer's connection broke or its wait timed out (a victim)
EXCEPTION = "exception"  # an uncaught exception of its own ended it
DIED = "died"  # its log stops without being closed and the process is gone: killed (SIGKILL, OOM) or crashed
UNKNOWN = "unknown"  # no log, or an unclosed log whose process cannot be checked
FROZEN = "frozen"  # its process existed while its log stood still: stopped, or holding the GIL (weigh.frozen_ranks)

# A log with heartbeats whose last record is older than this (on the reader's clock) belongs to a dead process.
STALE_NS = 10 * 10**9
# Errors of a rank that waited on a peer that went away: its connection broke, or its wait timed out.
_CONNECTION_ERRORS = ("connection reset", "connection closed", "closed by peer", "broken pipe",
                      "connection refused", "socket closed", "econnreset", "epipe", "timed out", "timeout")


@dataclass(frozen=True, slots=True)
class RankEnd:
    """``how`` (see the constants above), when (aligned to rank 0; the last record for a dead rank) and what;
    ``exit``: when and how `record` saw its process end, if it did."""

    rank: int
    how: str
    t_ns: int | None
    detail: str
    exit: RankExit | None = None

    def ended_before(self, other: RankEnd) -> bool:
        """Whether this rank's process is known to have ended before ``other``'s (``RankExit.before``)."""
        return self.exit is not None and other.exit is not None and self.exit.before(other.exit)


def is_connection_error(text: str) -> bool:
    low = text.lower()
    return any(k in low for k in _CONNECTION_ERRORS)


def rank_ends(job: Job, now_ns: int | None = None) -> dict[int, RankEnd]:
    """Every rank with a recorder log: how its process ended, or that it runs. ``now_ns``: the reader's clock,
    to judge an unclosed log written on another host by its last heartbeat (None: not judged)."""
    out = {}
    hosts_done = {j.get("host") for j in job.jobs if j.get("ended_ns")}
    for rank, info in job.ranks.items():
        if info.closed_cleanly is None:
            continue
        out[rank] = replace(_rank_end(job, rank, info, hosts_done, now_ns), exit=info.exit)
    return out


def _rank_end(job: Job, rank: int, info, hosts_done: set, now_ns: int | None) -> RankEnd:
    for t, cause, detail in info.endings:
        if cause == "signal" or detail.startswith("KeyboardInterrupt"):
            return RankEnd(rank, SIGNALLED, t, detail if cause == "signal" else "SIGINT (KeyboardInterrupt)")
    failed = _failed_call(job, rank)
    for t, cause, detail in info.endings:
        if cause == "exception":
            if is_connection_error(detail) or failed is not None:
                return RankEnd(rank, PEER_LOST, t, detail)
            return RankEnd(rank, EXCEPTION, t, detail)
    if failed is not None:
        return RankEnd(rank, PEER_LOST, failed[0], failed[1])
    if info.closed_cleanly:
        return RankEnd(rank, EXITED, info.last_ns, info.closed_reason or "exit")
    if info.alive is True:
        return RankEnd(rank, RUNNING, info.last_ns, "its process is running")
    if info.alive is False:
        return RankEnd(rank, DIED, info.last_ns, "its log stops without being closed and its process is gone")
    if info.host in hosts_done:
        return RankEnd(rank, DIED, info.last_ns, "its log stops without being closed, and the job on its host ended")
    if info.heartbeats and now_ns is not None and info.last_ns is not None:
        if now_ns - info.last_ns < STALE_NS:
            return RankEnd(rank, RUNNING, info.last_ns, "its last heartbeat is recent")
        return RankEnd(rank, DIED, info.last_ns, "its log stops without being closed (no heartbeat since)")
    return RankEnd(rank, UNKNOWN, info.last_ns, "its log was not closed")


def _failed_call(job: Job, rank: int) -> tuple[int, str] | None:
    """The first of the rank's calls that failed with a connection error: (time, error)."""
    log = job.logs.get(rank)
    for call in log.calls if log is not None else ():
        if call.error is not None and is_connection_error(call.error):
            return call.t_return_ns or call.t_call_ns, f"{call.op} failed: {call.error}"
    return None


def interruption_ns(job: Job, ends: Mapping[int, RankEnd]) -> int | None:
    """When the job was interrupted: when `record` got the SIGINT/SIGTERM it forwarded to the job, else the
    first one a rank logged (from a scheduler, or from a launcher ending the survivors of a dead rank);
    None if never."""
    forwarded = [j["signal_ns"] for j in job.jobs if isinstance(j.get("signal_ns"), int)]
    if forwarded:
        return min(forwarded)
    times = [e.t_ns for e in ends.values() if e.how == SIGNALLED and e.t_ns is not None]
    return min(times) if times else None
