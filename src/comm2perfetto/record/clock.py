"""Clock offset of each rank to rank 0, measured once at start-up through the job's c10d store.

Rank r writes a request key and polls for rank 0's answer, which carries rank 0's wall clock; the offset is
rank 0's time minus the midpoint of r's request and answer, taken from the sample with the smallest round
trip (uncertainty: half of it). Rank 0 answers ranks in order from a background thread. Only non-blocking
store calls (``set``, ``check``, ``get`` of a present key) are used, so the training thread's own store traffic
is never held up. Merge refines these offsets from matched collectives.

Store keys: ``comm2perfetto/clock/<rank>/<i>/q`` and ``.../a`` (the answer: rank 0's ``time.time_ns()``).

Recording's stop ends the measurement and waits for its thread: a thread of ours still inside a store call when
the process exits made a rank of a short job abort at exit on torch 2.4 ("terminate called without an active
exception", 3 in 10 runs of a 2-rank gloo job; none with the thread stopped).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

SAMPLES = 5
TIMEOUT_S = 60.0
JOIN_TIMEOUT_S = 2.0
_POLL_S = 0.0002


def _poll(store: Any, key: str, deadline: float, stop: threading.Event) -> bool:
    while not store.check([key]):
        if time.monotonic() > deadline or stop.is_set():
            return False
        time.sleep(_POLL_S)
    return True


def serve(store: Any, world_size: int, stop: threading.Event | None = None) -> None:
    """Rank 0: answer every other rank's requests, in rank order (until ``stop`` is set)."""
    stop = stop or threading.Event()
    for rank in range(1, world_size):
        deadline = time.monotonic() + TIMEOUT_S
        for i in range(SAMPLES):
            base = f"comm2perfetto/clock/{rank}/{i}"
            if not _poll(store, base + "/q", deadline, stop):
                break  # that rank does not record (or died): do not hold up the others
            store.set(base + "/a", str(time.time_ns()))


def measure(store: Any, rank: int, stop: threading.Event | None = None) -> tuple[int, int] | None:
    """Rank r > 0: return (offset_ns, rtt_ns) with t_rank0 = t_local + offset_ns, or None on timeout (or
    ``stop``)."""
    stop = stop or threading.Event()
    best: tuple[int, int] | None = None
    deadline = time.monotonic() + TIMEOUT_S * 2
    for i in range(SAMPLES):
        base = f"comm2perfetto/clock/{rank}/{i}"
        t1 = time.time_ns()
        store.set(base + "/q", "")
        if not _poll(store, base + "/a", deadline, stop):
            return best
        t2 = time.time_ns()
        remote = int(store.get(base + "/a"))
        rtt = t2 - t1
        if best is None or rtt < best[1]:
            best = (remote - (t1 + t2) // 2, rtt)
        store.delete_key(base + "/q")
        store.delete_key(base + "/a")
    return best


class Measurement:
    """The measurement's daemon thread, which hands its result to ``report(offset_ns, rtt_ns)``."""

    def __init__(self, store: Any, rank: int, world_size: int, report: Callable[[int, int], None]) -> None:
        self._stop = threading.Event()

        def run() -> None:
            try:
                if rank == 0:
                    report(0, 0)
                    serve(store, world_size, self._stop)
                else:
                    result = measure(store, rank, self._stop)
                    if result is not None and not self._stop.is_set():
                        report(*result)
            except Exception:  # the offset is a refinement: merge falls back to matched collectives
                return

        self._thread = threading.Thread(target=run, name="comm2perfetto-clock", daemon=True)
        self._thread.start()

    def stop(self, wait: bool = True) -> None:
        """End the measurement; ``wait``: until its thread is out of the store (a store call returns at once)."""
        self._stop.set()
        if wait and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(JOIN_TIMEOUT_S)


def start(store: Any, rank: int, world_size: int, report: Callable[[int, int], None]) -> Measurement:
    """Start the measurement (see ``Measurement``)."""
    return Measurement(store, rank, world_size, report)
