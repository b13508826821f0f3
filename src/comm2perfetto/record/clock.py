"""Clock offset of each rank to rank 0, measured once at start-up through the job's c10d store.

Rank r writes a request key and polls for rank 0's answer, which carries rank 0's wall clock; the offset is
rank 0's time minus the midpoint of r's request and answer, taken from the sample with the smallest round
trip (uncertainty: half of it). Rank 0 answers ranks in order from a background thread. Only non-blocking
store calls (``set``, ``check``, ``get`` of a present key) are used, so the training thread's own store traffic
is never held up. Merge refines these offsets from matched collectives.

The measurement is stopped with the recorder (``ClockMeasurement.stop``), finished or not: a daemon thread
still inside a store call when the interpreter finalises aborts the process (see ``ClockMeasurement``).

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
JOIN_TIMEOUT_S = 5.0  # each store call here returns at once; a store that hangs must not hang the exit


def _poll(store: Any, key: str, deadline: float, stopped: threading.Event) -> bool:
    while not store.check([key]):
        if time.monotonic() > deadline or stopped.is_set():
            return False
        time.sleep(_POLL_S)
    return True


def serve(store: Any, world_size: int, stopped: threading.Event) -> None:
    """Rank 0: answer every other rank's requests, in rank order, until ``stopped``."""
    for rank in range(1, world_size):
        deadline = time.monotonic() + TIMEOUT_S
        for i in range(SAMPLES):
            base = f"comm2perfetto/clock/{rank}/{i}"
            if not _poll(store, base + "/q", deadline, stopped):
                break  # that rank does not record (or died): do not hold up the others
            store.set(base + "/a", str(time.time_ns()))
        if stopped.is_set():
            return


def measure(store: Any, rank: int, stopped: threading.Event) -> tuple[int, int] | None:
    """Rank r > 0: return (offset_ns, rtt_ns) with t_rank0 = t_local + offset_ns, or None on timeout (or
    the best sample so far once ``stopped``)."""
    best: tuple[int, int] | None = None
    deadline = time.monotonic() + TIMEOUT_S * 2
    for i in range(SAMPLES):
        base = f"comm2perfetto/clock/{rank}/{i}"
        t1 = time.time_ns()
        store.set(base + "/q", "")
        if not _poll(store, base + "/a", deadline, stopped):
            return best
        t2 = time.time_ns()
        remote = int(store.get(base + "/a"))
        rtt = t2 - t1
        if best is None or rtt < best[1]:
            best = (remote - (t1 + t2) // 2, rtt)
        store.delete_key(base + "/q")
        store.delete_key(base + "/a")
    return best


class ClockMeasurement:
    """The measurement's daemon thread, which the recorder stops (and waits for) when it stops.

    A job shorter than the exchange (a few store round trips per rank, longer on a loaded machine) used to
    exit with this thread still polling the store. CPython before 3.14 ends a daemon thread that wants the GIL
    back during finalisation with ``pthread_exit``, whose unwinding reaches the ``noexcept`` destructor of
    pybind11's ``gil_scoped_release`` around torch's ``Store.check``: ``std::terminate`` ("terminate called
    without an active exception"), SIGABRT, and the job's exit status changed after a clean exit (CPython
    gh-87135; 3.14 lets such a thread hang instead).
    """

    def __init__(self, store: Any, rank: int, world_size: int, report: Callable[[int, int], None]) -> None:
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(store, rank, world_size, report),
                                        name="comm2perfetto-clock", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self, store: Any, rank: int, world_size: int, report: Callable[[int, int], None]) -> None:
        try:
            if rank == 0:
                report(0, 0)
                serve(store, world_size, self._stopped)
            else:
                result = measure(store, rank, self._stopped)
                if result is not None:  # also the best of the samples taken before a stop
                    report(*result)
        except Exception:  # the offset is a refinement: merge falls back to matched collectives
            return

    def stop(self, wait: bool = True) -> None:
        """End the measurement; ``wait``: until the thread is out of its store call (``JOIN_TIMEOUT_S`` at
        most), so that no recorder thread is inside torch's C++ when the interpreter finalises."""
        self._stopped.set()
        if wait and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(JOIN_TIMEOUT_S)


def start(store: Any, rank: int, world_size: int, report: Callable[[int, int], None]) -> ClockMeasurement:
    """Run the measurement in a daemon thread and hand the result to ``report(offset_ns, rtt_ns)``."""
    measurement = ClockMeasurement(store, rank, world_size, report)
    measurement.start()
    return measurement
