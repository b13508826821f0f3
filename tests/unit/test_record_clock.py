"""The clock-offset exchange (record/clock.py) through a real c10d store: its result, and that stopping the
recorder ends it at once, also while it still waits for its peer.

A measurement left running at exit was inside ``Store.check`` when the interpreter finalised, and CPython
3.11 ended that daemon thread by unwinding it through a ``noexcept`` pybind11 destructor: std::terminate,
SIGABRT after a clean exit (tests/integration/test_record_exit.py runs such a job)."""

from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist

import comm2perfetto
from comm2perfetto.record import clock


def _clock_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "comm2perfetto-clock"]


def test_rank_1_gets_its_offset_from_rank_0():
    store = dist.HashStore()
    reports: dict[int, tuple[int, int]] = {}
    for rank in (0, 1):
        clock.start(store, rank, 2, lambda offset, rtt, rank=rank: reports.setdefault(rank, (offset, rtt)))
    for thread in _clock_threads():
        thread.join(30)
    assert reports[0] == (0, 0)
    offset, rtt = reports[1]
    assert 0 < rtt < 10**9
    assert abs(offset) <= rtt  # one process, one clock: the offset is within the round trip's uncertainty


@pytest.mark.parametrize("rank", [0, 1], ids=["rank 0 waiting for a request", "rank 1 waiting for an answer"])
def test_stop_ends_a_measurement_whose_peer_never_comes(rank):
    store = dist.HashStore()  # nobody else uses it: rank 0 would wait TIMEOUT_S, rank 1 twice that
    reports: list[tuple[int, int]] = []
    measurement = clock.start(store, rank, 2, lambda offset, rtt: reports.append((offset, rtt)))
    time.sleep(0.05)
    assert _clock_threads()  # still polling the store
    began = time.monotonic()
    measurement.stop()
    assert _clock_threads() == []
    assert time.monotonic() - began < clock.JOIN_TIMEOUT_S / 5
    assert reports == ([(0, 0)] if rank == 0 else [])  # no sample completed: no offset for rank 1


def test_stopping_the_recorder_stops_the_exchange(tmp_path, fr_env, monkeypatch):
    """The session ends the exchange with recording: here rank 0 of a world of two whose rank 1 never asks."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)  # what session.start reads
        comm2perfetto.enable(str(tmp_path / "out"), stall_after=None)
        try:
            assert _clock_threads()  # serving rank 1, for a minute
        finally:
            comm2perfetto.disable()
        assert _clock_threads() == []
    finally:
        dist.destroy_process_group()
