"""The live windows' rank side without a job: summaries read back from a real event log (record/window.py),
and the exchange through a real c10d store (record/gather.py): publishing, gathering, taking over, copying."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest

torch_dist = pytest.importorskip("torch.distributed")

from comm2perfetto import layout  # noqa: E402
from comm2perfetto.record import gather as gather_module  # noqa: E402
from comm2perfetto.record.gather import WindowExchange, copying_ranks, window_doc  # noqa: E402
from comm2perfetto.record.log import EventLog  # noqa: E402
from comm2perfetto.record.watchdog import Watchdog  # noqa: E402
from comm2perfetto.record.window import MAX_ARRIVALS, WindowSummaries  # noqa: E402
from comm2perfetto.sources.event_log import read_event_log  # noqa: E402
from comm2perfetto.sources.live_window import read_window  # noqa: E402

S = 1_000_000_000
MS = 1_000_000
EVERY = 5.0
T0 = 359_181_700 * 5 * S  # a window boundary: window 359181700 begins here


class Counter:
    """A group's sequence counter the test advances."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> int:
        return self.n


class FakeRecorder:
    """What the window summaries and the watchdog read of a recorder (view.RecorderView), over a real log."""

    def __init__(self, tmp_path: Path, rank: int = 0, groups=None) -> None:
        self.rank = rank
        self.log = EventLog(str(tmp_path / layout.event_log(rank)))
        self.log.write({"kind": "header", "format": "comm2perfetto-events", "version": 1, "rank": rank,
                        "world_size": 4, "wall_ns": T0})
        self.clock = (0, 0)
        self.flight = None
        self.warnings: list[str] = []
        self._groups = groups or [SimpleNamespace(name="0", desc="default_pg", ranks=[0, 1, 2, 3], cpu=True,
                                                  seq_counter=Counter(), p2p_consumed=0)]

    def groups(self):
        return list(self._groups)

    def group_name(self, gid: int) -> str:
        return self._groups[gid].name

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        self.log.write(["w", T0, message])

    def fault(self, exc: BaseException) -> None:
        raise AssertionError(f"the recorder faulted: {exc}")


class Clock:
    def __init__(self, t: int) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


def _call(log: EventLog, cid: int, t: int, op: str = "all_reduce", gid: int = 0, seq: int | None = 1,
          is_async: bool = False, tid: int | None = None, aid: int = 1) -> None:
    tid = tid if tid is not None else __import__("threading").main_thread().ident
    log.write(["b", cid, t, op, gid, seq, None, is_async, tid, 1, 0, 0, aid])


def test_a_window_adds_up_its_calls_steps_and_arrivals(tmp_path):
    cpu = SimpleNamespace(name="0", desc="default_pg", ranks=[0, 1, 2, 3], cpu=True, seq_counter=Counter(),
                          p2p_consumed=0)
    gpu = SimpleNamespace(name="1", desc="dp", ranks=[0, 2], cpu=False, seq_counter=Counter(), p2p_consumed=0)
    rec = FakeRecorder(tmp_path, groups=[cpu, gpu])
    clock = Clock(T0 + 100 * MS)
    windows = WindowSummaries(rec, EVERY, clock=clock)
    log = rec.log
    log.write(["a", 1, [[4]], ["Float"], 16])
    log.write(["a", 2, [[1024]], ["Float"], 4096])
    _call(log, 1, T0 + 1 * S, seq=1)  # synchronous on gloo: 200 ms, exposed
    log.write(["e", 1, T0 + 1 * S + 200 * MS, 1])
    _call(log, 2, T0 + 2 * S, seq=2, is_async=True, aid=2)  # async on gloo: its `d` times it
    log.write(["e", 2, T0 + 2 * S + 1 * MS, 2])
    log.write(["d", 2, T0 + 2 * S + 50 * MS])
    for step, at in enumerate((0.5, 1.5, 2.5, 4.5), 1):
        log.write(["p", step, T0 + int(at * S), "optimizer"])
    _call(log, 3, T0 + 4_900 * MS, seq=3)  # issued in this window, completed in the next
    log.write(["e", 3, T0 + 5_100 * MS, 3])
    cpu.seq_counter.n = 3
    clock.t = T0 + 5_200 * MS
    windows.tick()
    log.write(["z", T0 + 6 * S, 0, "exit"])
    log.close()

    (window,) = read_event_log(log.path).windows
    assert (window.window, window.t0_ns, window.t1_ns) == (359_181_700, T0 + 100 * MS, T0 + 5 * S)
    assert (window.steps, window.step_ns) == (4, 1 * S)  # steps of 1, 1 and 2 s: the median
    # Not every call was a synchronous one of the main thread: what it waited in is not known.
    assert window.exposed_ns is None
    group = window.groups["0"]
    assert group.issued == 3
    (ops,) = group.ops.values()
    assert (ops.n, ops.nbytes, ops.time_ns, ops.timed) == (2, 16 + 4096, 250 * MS, 2)
    assert (group.seqs, group.arrivals_us) == ((1, 2, 3), (900_000, 1_900_000, 4_800_000))  # after t0, in µs


def test_exposed_time_is_known_where_every_call_was_synchronous_on_the_cpu(tmp_path):
    rec = FakeRecorder(tmp_path)
    clock = Clock(T0)
    windows = WindowSummaries(rec, EVERY, clock=clock)
    rec.log.write(["a", 1, [[4]], ["Float"], 16])
    for cid, at in enumerate((1, 2, 3), 1):
        _call(rec.log, cid, T0 + at * S, seq=cid)
        rec.log.write(["e", cid, T0 + at * S + 10 * MS, cid])
    clock.t = T0 + 5 * S
    windows.tick()
    (window,) = _windows(rec)
    assert window.exposed_ns == 30 * MS


def test_calls_on_a_gpu_backend_are_counted_not_timed(tmp_path):
    gpu = SimpleNamespace(name="0", desc="default_pg", ranks=[0, 1], cpu=False, seq_counter=None, p2p_consumed=0)
    rec = FakeRecorder(tmp_path, groups=[gpu])
    clock = Clock(T0)
    windows = WindowSummaries(rec, EVERY, clock=clock)
    rec.log.write(["a", 1, [[4]], ["Float"], 16])
    _call(rec.log, 1, T0 + S, seq=1)  # returns at the enqueue: nothing says when it completed
    rec.log.write(["e", 1, T0 + S + MS, 1])
    _call(rec.log, 2, T0 + 2 * S, seq=2, is_async=True)
    rec.log.write(["e", 2, T0 + 2 * S + MS, 2])
    clock.t = T0 + 5 * S
    windows.tick()
    (window,) = _windows(rec)
    (ops,) = window.groups["0"].ops.values()
    assert (ops.n, ops.timed, ops.time_ns) == (2, 0, 0) and window.groups["0"].issued is None
    assert window.exposed_ns is None


def test_many_collectives_keep_the_seqs_of_a_power_of_two_stride(tmp_path):
    rec = FakeRecorder(tmp_path)
    clock = Clock(T0)
    windows = WindowSummaries(rec, EVERY, clock=clock)
    rec.log.write(["a", 1, [[4]], ["Float"], 16])
    for seq in range(1, 201):
        _call(rec.log, seq, T0 + seq * 10 * MS, seq=seq)
        rec.log.write(["e", seq, T0 + seq * 10 * MS + 1000, seq])
    clock.t = T0 + 5 * S
    windows.tick()
    (window,) = _windows(rec)
    seqs = list(window.groups["0"].seqs)
    assert seqs == list(range(8, 201, 8)) and len(seqs) <= MAX_ARRIVALS  # 200 collectives: every 8th


def test_windows_follow_the_job_clock_and_the_last_goes_to_the_log_at_close(tmp_path):
    rec = FakeRecorder(tmp_path, rank=1)
    rec.clock = (-300 * MS, 2 * MS)  # this rank's clock is 300 ms ahead of rank 0's
    clock = Clock(T0 + 300 * MS + 10 * MS)
    windows = WindowSummaries(rec, EVERY, clock=clock)
    clock.t = T0 + 5 * S + 299 * MS  # 4.999 s on the job's clock: the window is still open
    windows.tick()
    assert _windows(rec) == []
    clock.t = T0 + 5 * S + 300 * MS
    windows.tick()
    clock.t = T0 + 7 * S
    windows.close()
    first, last = _windows(rec)
    assert (first.window, first.t1_ns) == (359_181_700, T0 + 5 * S + 300 * MS)  # its own clock, as every record
    assert (last.window, last.t0_ns, last.t1_ns) == (359_181_701, first.t1_ns, T0 + 7 * S)


def _windows(rec: FakeRecorder):
    data = rec.log.read_from(0)
    path = rec.log.path + ".copy"
    Path(path).write_bytes(data)
    return read_event_log(path).windows


def test_a_failing_window_step_turns_the_windows_off_with_one_warning(tmp_path):
    rec = FakeRecorder(tmp_path)

    class Broken:
        def tick(self) -> None:
            raise OSError("No space left on device")

    watchdog = Watchdog(rec, None, None, str(tmp_path), windows=Broken())  # type: ignore[arg-type]
    watchdog.tick()
    watchdog.tick()
    assert rec.warnings == ["live windows off after an error: OSError: No space left on device"]


# --- the exchange -------------------------------------------------------------------------------------------


def _summary(rank: int, window: int, late_ms: float = 0.0, rtt_ns: int | None = 1000, seqs=range(1, 21),
             folder: str = "/runs/r1", host: str = "node0") -> dict:
    """A rank's summary as window.py publishes it: a collective every 200 ms, rank ``late_ms`` late."""
    t0 = window * 5 * S
    arrivals = [(seq * 200 * MS + int(late_ms * MS) + rank * 10_000) // 1000 for seq in seqs]
    return {"steps": 10, "step_ns": 500 * MS, "exposed_ns": 400 * MS, "rank": rank, "host": host, "folder": folder,
            "window": window, "t0_ns": t0, "t1_ns": t0 + 5 * S, "clock_rtt_ns": rtt_ns, "pid": 100 + rank,
            "groups": {"0": {"issued": 20, "ops": {"all_reduce": {"n": 20, "bytes": 320, "time_ns": 400 * MS,
                                                                  "timed": 20}},
                             "stride": 1, "seqs": list(seqs), "arrivals_us": arrivals, "desc": "default_pg",
                             "ranks_span": [0, 4]}}}


class TickClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _exchanges(tmp_path: Path, store, world: int = 4, folder: str | None = None):
    clock = TickClock()
    folder = folder or str(tmp_path)
    ranks = [SimpleNamespace(rank=r) for r in range(world)]
    return clock, [WindowExchange(rec, store, world, EVERY, folder, "node0", clock=clock) for rec in ranks]


def _publish(exchanges, window: int, late: dict[int, float], folder: str, skip=()) -> None:
    for ex in exchanges:
        rank = ex._rec.rank
        if rank not in skip:
            ex.publish(window, orjson.dumps(_summary(rank, window, late.get(rank, 0.0), folder=folder)))


def test_rank_0_gathers_once_every_rank_published_and_the_folder_gets_the_window(tmp_path):
    store = torch_dist.HashStore()
    _clock, exchanges = _exchanges(tmp_path, store)
    folder = str(tmp_path)
    _publish(exchanges, 7, {2: 30.0}, folder)
    for ex in exchanges:
        ex.tick()
    window = read_window(tmp_path / layout.LIVE_WINDOW_FILE)
    assert (window.window, window.gathered_by, window.missing, window.events) == (7, 0, (), ())
    (group,) = window.groups
    assert (group.group, group.desc, group.size, group.matched) == ("0", "default_pg", 4, 20)
    assert [m.rank for m in group.members if m.late] == [2]
    assert {r.rank for r in window.detail} == {0, 1, 2, 3}  # one folder: every rank's detail
    _publish(exchanges, 8, {2: 30.0}, folder)
    for ex in exchanges:
        ex.tick()
    window = read_window(tmp_path / layout.LIVE_WINDOW_FILE)
    (event,) = window.events
    assert (event["event"], event["rank"], event["windows"], event["host"]) == ("start", 2, [7, 8], "node0")
    assert window.stragglers == ((2, "0", 7),)
    # The store keeps a few windows at most: window 7's keys go once 9 is gathered.
    _publish(exchanges, 9, {}, folder)
    for ex in exchanges:
        ex.tick()
    assert not store.check([gather_module.KEY.format(7, 1)]) and not store.check([gather_module.ALL_KEY.format(7)])
    assert store.check([gather_module.KEY.format(8, 1)]) and store.check([gather_module.ALL_KEY.format(9)])


def test_a_rank_that_does_not_publish_is_missing_once_rank_0_has_waited(tmp_path):
    store = torch_dist.HashStore()
    clock, exchanges = _exchanges(tmp_path, store)
    _publish(exchanges, 7, {}, str(tmp_path), skip={3})
    exchanges[0].tick()
    assert not (tmp_path / layout.LIVE_WINDOW_FILE).exists()  # rank 0 waits for rank 3
    clock.t += exchanges[0].wait_s
    exchanges[0].tick()
    window = read_window(tmp_path / layout.LIVE_WINDOW_FILE)
    assert window.missing == (3,) and [r.rank for r in window.ranks] == [0, 1, 2]


def test_another_rank_takes_over_when_rank_0_does_not_gather_and_keeps_the_history(tmp_path):
    store = torch_dist.HashStore()
    clock, exchanges = _exchanges(tmp_path, store)
    folder = str(tmp_path)
    _publish(exchanges, 7, {2: 30.0}, folder)
    exchanges[0].tick()  # rank 0 gathers window 7 ...
    _publish(exchanges, 8, {2: 30.0}, folder, skip={0})  # ... and is frozen from then on
    start = clock.t
    for ex in exchanges[1:]:
        ex.tick()
    assert read_window(tmp_path / layout.LIVE_WINDOW_FILE).window == 7
    clock.t = start + exchanges[1].wait_s + exchanges[1].takeover_s
    for ex in exchanges[1:]:
        ex.tick()
    window = read_window(tmp_path / layout.LIVE_WINDOW_FILE)
    assert (window.window, window.gathered_by, window.missing) == (8, 1, (0,))
    # Rank 1 read window 7's verdicts from the store: rank 2 late in 7 and 8 is a straggler now.
    (event,) = window.events
    assert (event["rank"], event["windows"]) == (2, [7, 8])


def test_every_host_and_folder_gets_a_copy_from_its_lowest_rank(tmp_path):
    summaries = [{"rank": r, "host": f"node{r // 2}", "folder": "/runs/r1"} for r in (3, 1, 2, 0)]
    summaries.append({"rank": 5, "host": "node0", "folder": "/other"})
    assert copying_ranks(summaries) == [0, 2, 5]
    store = torch_dist.HashStore()
    clock = TickClock()
    node = [tmp_path / "node0", tmp_path / "node1"]
    exchanges = [WindowExchange(SimpleNamespace(rank=r), store, 4, EVERY, str(node[r // 2]), f"node{r // 2}",
                                clock=clock) for r in range(4)]
    for ex in exchanges:
        r = ex._rec.rank
        ex.publish(7, orjson.dumps(_summary(r, 7, folder=str(node[r // 2]), host=f"node{r // 2}")))
    for ex in exchanges:
        ex.tick()
    for i, folder in enumerate(node):
        window = read_window(folder / layout.LIVE_WINDOW_FILE)
        assert len(window.ranks) == 4  # the whole job's window ...
        assert {r.rank for r in window.detail} == {2 * i, 2 * i + 1}  # ... with its own ranks' detail


def test_a_rank_whose_clock_is_not_trusted_is_left_out_of_the_comparison():
    summaries = [_summary(r, 7, late_ms=30.0 if r == 2 else 0.0) for r in range(3)]
    summaries.append(_summary(3, 7, late_ms=80.0, rtt_ns=150 * MS))  # its round trip: over 100 ms
    doc, _ = window_doc(7, EVERY, 4, summaries, gather_module.StragglerTracker(), {})
    (group,) = doc["groups"]
    assert (group["compared"], [m["rank"] for m in group["ranks"]]) == (3, [0, 1, 2])
    assert [m["rank"] for m in group["ranks"] if m["late"]] == [2]
    assert [r["clock"] for r in doc["ranks"]] == ["measured", "measured", "measured", "untrusted"]


def test_a_collective_a_late_rank_issues_after_the_window_closed_is_matched_in_the_next():
    tracker = gather_module.StragglerTracker()
    first = [_summary(r, 7, seqs=range(1, 11) if r == 2 else range(1, 12)) for r in range(4)]
    doc, carry = window_doc(7, EVERY, 4, first, tracker, {})
    assert doc["groups"][0]["matched"] == 10
    assert {rank: list(seqs) for rank, seqs in carry["0"].items()} == {0: [11], 1: [11], 3: [11]}
    second = [_summary(r, 8, seqs=range(11, 21) if r == 2 else range(12, 21)) for r in range(4)]
    doc, carry = window_doc(8, EVERY, 4, second, tracker, carry)
    assert doc["groups"][0]["matched"] == 10 and carry == {}


def test_the_exchange_uses_only_calls_that_return_at_once(tmp_path):
    """A blocking get or wait on the job's store could hold the watchdog for the store's timeout: every get is of
    a key checked (or counted) first."""

    class Strict:
        def __init__(self) -> None:
            self.store = torch_dist.HashStore()
            self.calls: list[str] = []

        def __getattr__(self, name: str):
            def call(*args):
                self.calls.append(name)
                if name in ("get", "multi_get"):
                    keys = args[0] if name == "multi_get" else [args[0]]
                    assert all(self.store.check([k]) for k in keys), f"{name} of a missing key"
                assert name in ("set", "add", "check", "get", "multi_get", "delete_key"), name
                return getattr(self.store, name)(*args)

            return call

    store = Strict()
    _clock, exchanges = _exchanges(tmp_path, store)
    for window in (7, 8, 9):
        _publish(exchanges, window, {2: 30.0}, str(tmp_path))
        for ex in exchanges:
            ex.tick()
    assert {"set", "add", "check", "get", "multi_get", "delete_key"} >= set(store.calls)
    assert read_window(tmp_path / layout.LIVE_WINDOW_FILE).window == 9
    assert os.path.exists(tmp_path / layout.LIVE_WINDOW_FILE)
