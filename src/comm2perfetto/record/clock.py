"""Clock offset of each rank to rank 0, measured once at start-up through the job's c10d store.

Rank r writes a request key and polls for rank 0's answer, which carries rank 0's wall clock; the offset is
rank 0's time minus the midpoint of r's request and answer, taken from the sample with the smallest round
trip (uncertainty: half of it). Rank 0 answers ranks in order from a background thread. Only non-blocking
store calls (``set``, ``check``, ``get`` of a present key) are used, so the training thread's own store traffic
is never held up. Merge refines these offsets from matched collectives.

Store keys: ``comm2perfetto/clock/<rank>/<i>/q`` and ``.../a`` (the answer: rank 0's ``time.time_ns()``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

SAMPLES = 5
TIMEOUT_S = 60.0
_POLL_S = 0.0002


def _poll(store: Any, key: str, deadline: float) -> bool:
    while not store.check([key]):
        if time.monotonic() > deadline:
            return False
        time.sleep(_POLL_S)
    return True


def serve(store: Any, world_size: int) -> None:
    """Rank 0: answer every other rank's requests, in rank order."""
    for rank in range(1, world_size):
        deadline = time.monotonic() + TIMEOUT_S
        for i in range(SAMPLES):
            base = f"comm2perfetto/clock/{rank}/{i}"
            if not _poll(store, base + "/q", deadline):
                break  # that rank does not record (or died): do not hold up the others
            store.set(base + "/a", str(time.time_ns()))


def measure(store: Any, rank: int) -> tuple[int, int] | None:
    """Rank r > 0: return (offset_ns, rtt_ns) with t_rank0 = t_local + offset_ns, or None on timeout."""
    best: tuple[int, int] | None = None
    deadline = time.monotonic() + TIMEOUT_S * 2
    for i in range(SAMPLES):
        base = f"comm2perfetto/clock/{rank}/{i}"
        t1 = time.time_ns()
        store.set(base + "/q", "")
        if not _poll(store, base + "/a", deadline):
            return best
        t2 = time.time_ns()
        remote = int(store.get(base + "/a"))
        rtt = t2 - t1
        if best is None or rtt < best[1]:
            best = (remote - (t1 + t2) // 2, rtt)
        store.delete_key(base + "/q")
        store.delete_key(base + "/a")
    return best


def start(store: Any, rank: int, world_size: int, report: Callable[[int, int], None]) -> None:
    """Run the measurement in a daemon thread and hand the result to ``report(offset_ns, rtt_ns)``."""

    def run() -> None:
        try:
            if rank == 0:
                report(0, 0)
                serve(store, world_size)
            else:
                result = measure(store, rank)
                if result is not None:
                    report(*result)
        except Exception:  # the offset is a refinement: merge falls back to matched collectives
            return

    threading.Thread(target=run, name="comm2perfetto-clock", daemon=True).start()
