"""The live verdict without a job: snapshots as record/live.py writes them, read, judged and watched."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import orjson
import pytest

from comm2perfetto import layout
from comm2perfetto.diagnose.live import live_diagnosis
from comm2perfetto.sources.live import LiveSnapshotError, read_snapshot
from comm2perfetto.stall_watch import StallWatcher, process_state

T0 = 1_795_313_447_000_000_000


def _rank(rank: int, issued: int | None, pending: tuple[str, int, float] | None = None, stack=None,
          group: str = "0", members=(0, 1, 2)) -> dict:
    """One rank summary; ``pending`` is (op, seq, seconds after T0 it began)."""
    p = None if pending is None else {"op": pending[0], "seq": pending[1], "since_ns": T0 + int(pending[2] * 1e9),
                                      "source": "patch"}
    return {"rank": rank, "host": "node0", "pid": 100 + rank, "t_ns": T0 + 10**10, "step": 3,
            "groups": {group: {"desc": "default_pg", "ranks": list(members), "issued": issued, "pending": p}},
            "stack": list(stack if stack is not None else [f"train.py:{50 + rank} main"])}


def _snapshot(*ranks: dict, world: int = 3) -> dict:
    return {"format": "comm2perfetto-live", "version": 1, "gen": 1, "world_size": world, "gathered_ns": T0,
            "gathered_by": 0, "ranks": list(ranks)}


def _write(folder: Path, name: str, doc: dict) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(doc))
    return path


def _verdict(tmp_path: Path, snapshot: dict):
    return live_diagnosis(read_snapshot(str(_write(tmp_path, "s.json", snapshot))))


def test_a_rank_that_never_issued_the_collective_is_the_culprit(tmp_path):
    d = _verdict(tmp_path, _snapshot(
        _rank(0, 4, ("all_reduce", 4, 0.0), ["train.py:57 main"]),
        _rank(1, 4, ("all_reduce", 4, 0.2)),
        _rank(2, 3, None, ["data.py:88 next_batch", "train.py:55 main"]),
    ))
    assert d.status == "stuck"
    (f,) = d.findings
    assert (f.kind, f.process_group, f.op, f.seq) == ("missing_ranks", "default_pg", "all_reduce", 4)
    assert (f.culprit_ranks, f.ranks_joined, f.ranks_missing) == ((2,), (0, 1), (2,))
    assert f.stacks == {2: ("data.py:88 next_batch", "train.py:55 main")}
    assert f.call_sites == {0: "train.py:57", 1: "train.py:51"}
    assert "rank 2 had not issued all_reduce #4 on default_pg" in f.detail
    assert "Rank 2's last collective on default_pg was #3; it was at data.py:88 next_batch." in f.detail


def test_every_rank_waiting_tells_the_last_to_arrive_and_blames_nobody(tmp_path):
    """Arriving last says nothing about why every rank still waits: no culprit, no tie rule."""
    d = _verdict(tmp_path, _snapshot(
        _rank(0, 7, ("all_gather", 7, 0.0)), _rank(1, 7, ("all_gather", 7, 1.5)), _rank(2, 7, ("all_gather", 7, 0.1)),
    ))
    (f,) = d.findings
    assert (d.status, f.kind, f.culprit_ranks, f.suspect_ranks, f.seq) == ("stuck", "stuck_all_joined", (), (), 7)
    assert "Rank 1 arrived last, 1.50 s after the first" in f.detail


def test_different_ops_at_one_seq_make_every_waiting_rank_a_suspect_not_a_culprit(tmp_path):
    """Positions carry no history of what each rank issued before: nothing shows which side is wrong (and a
    vote is no evidence: two faulty ranks would outvote a sound one)."""
    d = _verdict(tmp_path, _snapshot(
        _rank(0, 5, ("all_reduce", 5, 0.0)), _rank(1, 5, ("broadcast", 5, 0.0)), _rank(2, 5, ("all_reduce", 5, 0.0)),
    ))
    (f,) = d.findings
    assert (d.status, f.kind, f.culprit_ranks, f.suspect_ranks) == ("desync", "op_mismatch", (), (0, 1, 2))
    assert "ranks 0, 2: all_reduce; rank 1: broadcast" in f.detail


def test_different_ops_on_a_tie_make_every_rank_a_suspect(tmp_path):
    d = _verdict(tmp_path, _snapshot(
        _rank(0, 5, ("all_reduce", 5, 0.0), members=(0, 1)), _rank(1, 5, ("broadcast", 5, 0.0), members=(0, 1)),
        world=2))
    (f,) = d.findings
    assert (d.status, f.kind, f.culprit_ranks, f.suspect_ranks) == ("desync", "op_mismatch", (), (0, 1))


def test_a_group_torch_left_undescribed_goes_by_its_name(tmp_path):
    """torch 2.4 reports ``undefined`` as the description of a group made without one (DeviceMesh's)."""
    ranks = [_rank(r, 5 if r else 4, ("all_reduce", 5, 0.0) if r else None, group="4") for r in range(3)]
    for summary in ranks:
        summary["groups"]["4"]["desc"] = "undefined"
    (f,) = _verdict(tmp_path, _snapshot(*ranks)).findings
    assert (f.kind, f.process_group, f.culprit_ranks) == ("missing_ranks", "4", (0,))
    assert "undefined" not in f.detail


def test_a_rank_that_did_not_answer_is_a_suspect_not_a_culprit_by_guess(tmp_path):
    d = _verdict(tmp_path, _snapshot(_rank(0, 4, ("all_reduce", 4, 0.0)), _rank(1, 4, ("all_reduce", 4, 0.0))))
    (f,) = d.findings
    assert (f.kind, f.ranks_missing, f.culprit_ranks, f.suspect_ranks) == ("no_dump", (2,), (), (2,))
    assert "did not answer the live gather" in f.detail
    assert d.status == "stuck"  # a stall is never OK, nor merely incomplete


def test_an_absent_rank_outside_the_stalled_group_is_named_once(tmp_path):
    d = _verdict(tmp_path, _snapshot(
        _rank(0, 4, ("all_reduce", 4, 0.0), members=(0, 1)), _rank(1, 3, None, members=(0, 1)),
    ))
    assert [(f.kind, f.culprit_ranks, f.suspect_ranks) for f in d.findings] == [
        ("missing_ranks", (1,), ()), ("no_dump", (), (2,))]


def test_a_stall_with_no_rank_waiting_is_stuck_cause_not_found(tmp_path):
    d = _verdict(tmp_path, _snapshot(_rank(0, 4), _rank(1, 4), _rank(2, 4)))
    (f,) = d.findings
    assert (d.status, f.kind, f.culprit_ranks, f.suspect_ranks) == ("stuck", "stall_unexplained", (), ())
    assert {r: a.state for r, a in d.ranks.items()} == {0: "outside", 1: "outside", 2: "outside"}


@pytest.mark.parametrize("bad", [
    {"rank": "zero"}, {"rank": 7}, {"rank": -1}, "text", None,
])
def test_bad_rank_summaries_are_dropped(tmp_path, bad):
    d = _verdict(tmp_path, _snapshot(_rank(0, 4, ("all_reduce", 4, 0.0)), _rank(1, 3), bad, world=2))
    assert d.ranks_with_data == (0, 1)
    assert d.findings[0].culprit_ranks == (1,)


def test_bad_fields_inside_a_summary_are_left_out(tmp_path):
    rank0 = _rank(0, 4, ("all_reduce", 4, 0.0))
    rank1 = _rank(1, 4, None)
    rank1["groups"]["0"]["issued"] = "four"  # unknown: neither joined nor missing
    rank1["groups"]["0"]["ranks"] = [0, 1, 99, "x"]
    rank1["stack"] = ["x"] * 1000
    snap = read_snapshot(str(_write(tmp_path, "s.json", _snapshot(rank0, rank1, world=2))))
    (_, checked) = snap["ranks"]
    assert checked["groups"]["0"]["issued"] is None
    assert checked["groups"]["0"]["ranks"] == [0, 1]
    assert len(checked["stack"]) == 16
    d = live_diagnosis(snap)  # rank 1's count unknown: a suspect of the wait, never "nothing to check"
    (f,) = d.findings
    assert (d.status, f.kind, f.ranks_joined, f.culprit_ranks, f.suspect_ranks) == ("stuck", "no_dump", (0,), (), (1,))


@pytest.mark.parametrize("content, message", [
    (b"", "unreadable"), (b"{]", "unreadable"), (b"[1, 2]", "not a comm2perfetto live snapshot"),
    (orjson.dumps({"format": "comm2perfetto-live", "world_size": 10**12}), "bad world_size"),
])
def test_unusable_snapshots_are_refused_with_one_message(tmp_path, content, message):
    path = tmp_path / "s.json"
    path.write_bytes(content)
    with pytest.raises(LiveSnapshotError, match=message):
        read_snapshot(str(path))


def test_a_fifo_is_not_read(tmp_path):
    path = tmp_path / "s.json"
    os.mkfifo(path)
    with pytest.raises(LiveSnapshotError, match="not a regular file"):
        read_snapshot(str(path))


# --- the watcher in `comm2perfetto record` ----------------------------------------------------------------


def _stalled(folder: Path, gen: int) -> None:
    _write(folder, layout.live_snapshot(gen), _snapshot(
        _rank(0, 4, ("all_reduce", 4, 0.0)), _rank(1, 4, ("all_reduce", 4, 0.1)), _rank(2, 3), world=3))


def _hook_log(folder: Path) -> str:
    return (folder / layout.LIVE_DIR / "on-stall.log").read_text()


def test_watcher_prints_once_per_picture_and_runs_the_hook_with_the_json(tmp_path):
    got = tmp_path / "got"
    err = io.StringIO()
    watcher = StallWatcher(str(tmp_path), f'cat > {got}.$COMM2PERFETTO_EVENT; echo $COMM2PERFETTO_VERDICT >> {got}',
                           err=err)
    _stalled(tmp_path, 1)
    _stalled(tmp_path, 2)  # a second rank's report of the same stall
    watcher.poll()
    _write(tmp_path, layout.live_resolved(1), {"format": "comm2perfetto-live", "gen": 1, "resolved_ns": T0})
    watcher.poll()
    assert "resolved" not in err.getvalue()  # stall 2 is still open
    _write(tmp_path, layout.live_resolved(2), {"format": "comm2perfetto-live", "gen": 2, "resolved_ns": T0})
    watcher.poll()
    watcher.stop()
    text = err.getvalue()
    assert text.count("STUCK: 1 finding") == 1
    assert "[1] missing_ranks on default_pg: all_reduce #4" in text and "culprit: 2" in text
    assert text.count("stall 2 resolved: the job went on") == 1
    stall = orjson.loads((tmp_path / "got.stall").read_bytes())
    assert (stall["event"], stall["gen"]) == ("stall", 1)
    assert stall["verdict"]["findings"][0]["culprit_ranks"] == [2]
    resolved = orjson.loads((tmp_path / "got.resolved").read_bytes())
    assert (resolved["event"], resolved["gen"], resolved["verdict"]) == ("resolved", 2, stall["verdict"])
    assert got.read_text().splitlines() == [str(tmp_path / layout.STALL_VERDICT_FILE)] * 2
    latest = orjson.loads((tmp_path / layout.STALL_VERDICT_FILE).read_bytes())
    assert (latest["event"], latest["gen"]) == ("resolved", 2)


def test_a_hook_that_hangs_is_killed_and_one_that_fails_is_reported(tmp_path):
    err = io.StringIO()
    watcher = StallWatcher(str(tmp_path), 'if [ "$COMM2PERFETTO_EVENT" = stall ]; then sleep 600; else exit 3; fi',
                           hook_timeout_s=0.5, err=err)
    _stalled(tmp_path, 1)
    started = time.monotonic()
    watcher.poll()
    _write(tmp_path, layout.live_resolved(1), {"format": "comm2perfetto-live", "gen": 1, "resolved_ns": T0})
    watcher.poll()  # the hook still sleeps: polling goes on
    assert time.monotonic() - started < 0.5
    watcher.stop()
    text = err.getvalue()
    assert "--on-stall command killed after 0.5 s" in text
    assert "--on-stall command exited with status 3" in text
    assert "stall" in _hook_log(tmp_path) and "resolved" in _hook_log(tmp_path)


def test_an_unreadable_snapshot_is_one_line_and_watching_goes_on(tmp_path):
    err = io.StringIO()
    watcher = StallWatcher(str(tmp_path), None, err=err)
    (tmp_path / layout.LIVE_DIR).mkdir()
    (tmp_path / layout.live_snapshot(1)).write_bytes(b"{ not json")
    watcher.poll()
    _stalled(tmp_path, 2)
    watcher.poll()
    watcher.stop()
    lines = err.getvalue().splitlines()
    assert lines[0].startswith("comm2perfetto: live verdict: ") and "unreadable" in lines[0]
    assert "culprit: 2" in err.getvalue()


# --- the rank side: publishing and gathering through the store ----------------------------------------------


class _Store:
    """The part of c10d's Store the live verdict uses, in a dict (values as bytes, as TCPStore returns)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.requests = 0

    def set(self, key, value) -> None:
        self.requests += 1
        self.data[key] = value if isinstance(value, bytes) else str(value).encode()

    def get(self, key) -> bytes:
        self.requests += 1
        return self.data[key]

    def add(self, key, amount: int) -> int:
        self.requests += 1
        value = int(self.data.get(key, b"0")) + amount
        self.data[key] = str(value).encode()
        return value

    def check(self, keys) -> bool:
        self.requests += 1
        return all(k in self.data for k in keys)


class _Rank:
    def __init__(self, rank: int) -> None:
        self.rank = rank


@pytest.fixture
def live_ranks(monkeypatch, tmp_path):
    """Three ranks on two nodes (0, 1 | 2) sharing one store, each with its own folder and a fake clock."""
    from comm2perfetto.record import live

    def summary(rec, fr=None, folder=""):
        return dict(_rank(rec.rank, 4, ("all_reduce", 4, 0.0)), host=f"node{rec.rank // 2}", folder=folder)

    monkeypatch.setattr(live, "rank_summary", summary)
    store, now = _Store(), [0.0]
    ranks = {r: live.LiveVerdict(_Rank(r), store, str(tmp_path / f"node{r // 2}"), 3, r % 2 if r < 2 else 0,
                                 clock=lambda: now[0]) for r in range(3)}
    return ranks, store, now, tmp_path


def _snapshot_ranks(path: Path) -> list[int]:
    return [s["rank"] for s in orjson.loads(path.read_bytes())["ranks"]]


def test_rank0_gathers_every_rank_and_the_other_node_copies_it(live_ranks):
    ranks, _store, _now, tmp = live_ranks
    for r in (0, 1, 2):
        ranks[r].on_stall(1)
    for r in (0, 2):
        ranks[r].tick()
    assert _snapshot_ranks(tmp / "node0" / layout.live_snapshot(1)) == [0, 1, 2]
    assert _snapshot_ranks(tmp / "node1" / layout.live_snapshot(1)) == [0, 1, 2]
    assert not (tmp / "node0" / layout.live_resolved(1)).exists()
    ranks[1].resolved(1)
    for r in (0, 2):
        ranks[r].tick()
    assert (tmp / "node0" / layout.live_resolved(1)).exists() and (tmp / "node1" / layout.live_resolved(1)).exists()


def test_rank0_waits_for_a_silent_rank_only_so_long(live_ranks):
    from comm2perfetto.record.live import GATHER_WAIT_S

    ranks, _store, now, tmp = live_ranks
    ranks[0].on_stall(1)
    ranks[1].on_stall(1)  # rank 2 never answers
    ranks[0].tick()
    assert not (tmp / "node0" / layout.live_snapshot(1)).exists()
    now[0] += GATHER_WAIT_S
    ranks[0].tick()
    assert _snapshot_ranks(tmp / "node0" / layout.live_snapshot(1)) == [0, 1]


def test_when_rank0_does_not_answer_another_rank_gathers_and_each_folder_gets_a_copy(live_ranks):
    from comm2perfetto.record.live import GATHER_WAIT_S

    ranks, store, now, tmp = live_ranks
    for r in (1, 2):  # rank 0 is the stuck one (frozen): it never publishes nor gathers
        ranks[r].on_stall(1)
    now[0] += GATHER_WAIT_S
    for r in (1, 2):
        ranks[r].tick()
    assert not (tmp / "node0" / layout.live_snapshot(1)).exists()  # rank 0's turn first
    now[0] += GATHER_WAIT_S
    for r in (1, 2):
        ranks[r].tick()
    snapshot = orjson.loads((tmp / "node0" / layout.live_snapshot(1)).read_bytes())
    assert (snapshot["gathered_by"], [s["rank"] for s in snapshot["ranks"]]) == (1, [1, 2])
    assert _snapshot_ranks(tmp / "node1" / layout.live_snapshot(1)) == [1, 2]
    assert store.data["comm2perfetto/live/1/claim"] == b"1"  # gathered once


def test_generations_created_at_once_are_each_gathered_complete(live_ranks):
    """Ranks 0 and 1 detected one stall at once: generations 1 and 2. Every rank publishes under both, so
    neither gathering lists a waiting rank as one that did not answer."""
    ranks, _store, _now, tmp = live_ranks
    ranks[0].on_stall(1, detected=True)
    ranks[1].on_stall(2, detected=True)  # it created 2 before it saw 1
    ranks[2].on_stall(2)
    ranks[0].on_stall(2)
    for r in (0, 2):
        ranks[r].tick()
    for gen in (1, 2):
        assert _snapshot_ranks(tmp / "node0" / layout.live_snapshot(gen)) == [0, 1, 2]


def test_a_stall_several_ranks_detected_resolves_when_the_last_of_their_calls_does(live_ranks):
    ranks = live_ranks[0]
    assert not ranks[0].still_open(0)
    ranks[0].on_stall(1, detected=True)
    assert ranks[1].still_open(1)
    ranks[1].on_stall(1, detected=True)  # joined: rank 1's call stalled too
    ranks[0].resolved(1)
    assert ranks[1].still_open(1)
    ranks[1].resolved(1)
    assert not ranks[1].still_open(1)


def test_nothing_is_asked_of_the_store_while_no_stall_is_open(live_ranks):
    ranks, store, _now, _tmp = live_ranks
    for _ in range(100):
        for r in ranks.values():
            r.tick()
    assert store.requests == 0


def test_a_long_hang_reports_a_bounded_number_of_stalls(live_ranks):
    from comm2perfetto.record.live import MAX_LIVE_STALLS

    ranks, store, _now, _tmp = live_ranks
    for gen in range(1, 3 * MAX_LIVE_STALLS):
        ranks[1].on_stall(gen)
    assert len([k for k in store.data if k.endswith("/1")]) == MAX_LIVE_STALLS


def test_readers_pass_over_the_verdict_file_quietly(tmp_path):
    from comm2perfetto.sources.discover import discover

    watcher = StallWatcher(str(tmp_path), None, err=io.StringIO())
    _stalled(tmp_path, 1)
    watcher.poll()
    watcher.stop()
    assert (tmp_path / layout.STALL_VERDICT_FILE).exists()
    found, skipped = discover([tmp_path])
    assert [(f.path.name, f.kind) for f in found] == [(layout.STALL_VERDICT_FILE, "verdict")]
    assert skipped == []  # the hidden .live folder is not walked either


def test_a_failing_store_turns_the_live_verdict_off_not_the_recorder():
    """The live verdict is an extra: when the store fails under it, the watchdog goes on (stall detection,
    dumps) with one warning, and recording is not disabled."""
    from comm2perfetto.record.watchdog import Watchdog

    class _Broken(_Store):
        def set(self, key, value):
            raise RuntimeError("store gone")

    class _Rec:
        rank = 0
        faulted = False

        def __init__(self):
            self.warnings: list[str] = []

        def warn(self, message):
            self.warnings.append(message)

        def fault(self, exc):
            self.faulted = True

    class _Live:
        def on_stall(self, gen, fr_pending=None):
            _Broken().set("k", b"v")

    rec = _Rec()
    dog = Watchdog(rec, _Store(), None, ".", live=_Live())
    dog._live_step(lambda: dog._live.on_stall(1))
    assert dog._live is None and not rec.faulted
    assert rec.warnings == ["live verdict off after an error: RuntimeError: store gone"]


def test_the_most_complete_snapshot_of_one_stall_is_the_verdict_kept(tmp_path):
    """Generation 1 was gathered before rank 2 answered; generation 2 of the same stall has every rank, and a
    third generation fewer again: the printed verdict, the file and the hook carry generation 2's."""
    err = io.StringIO()
    watcher = StallWatcher(str(tmp_path), None, err=err)
    waiting = (_rank(0, 4, ("all_reduce", 4, 0.0)), _rank(1, 4, ("all_reduce", 4, 0.1)))
    _write(tmp_path, layout.live_snapshot(1), _snapshot(*waiting))
    watcher.poll()
    _write(tmp_path, layout.live_snapshot(2), _snapshot(*waiting, _rank(2, 3)))
    watcher.poll()
    _write(tmp_path, layout.live_snapshot(3), _snapshot(waiting[0]))
    watcher.poll()
    watcher.stop()
    assert err.getvalue().count("live verdict at stall") == 2  # the partial one, then the complete one
    latest = orjson.loads((tmp_path / layout.STALL_VERDICT_FILE).read_bytes())
    (f,) = latest["verdict"]["findings"]
    assert (latest["gen"], f["kind"], f["culprit_ranks"], f["suspect_ranks"]) == (2, "missing_ranks", [2], [])


def _watch_a_silent_rank_2(tmp_path: Path, pid: int, **header: int) -> tuple[StallWatcher, dict]:
    """`record`'s watcher at a stall where ranks 0 and 1 wait in all_reduce #4 and rank 2, whose process ``pid``
    runs on this host (its log's header, with ``header``'s fields), did not answer: the watcher and the
    stall-verdict.json it wrote."""
    import socket

    fields = {"kind": "header", "format": "comm2perfetto-events", "version": 1, "rank": 2, "world_size": 3,
              "host": socket.gethostname(), "pid": pid, **header}
    (tmp_path / layout.event_log(2)).write_bytes(orjson.dumps(fields) + b"\n")
    watcher = StallWatcher(str(tmp_path), None, err=io.StringIO())
    _write(tmp_path, layout.live_snapshot(1), _snapshot(
        _rank(0, 4, ("all_reduce", 4, 0.0)), _rank(1, 4, ("all_reduce", 4, 0.1))))
    watcher.poll()
    watcher.stop()
    return watcher, orjson.loads((tmp_path / layout.STALL_VERDICT_FILE).read_bytes())


def test_a_rank_that_did_not_answer_but_whose_process_is_stopped_is_frozen(tmp_path):
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while process_state(proc.pid) != "stopped" and time.monotonic() < deadline:  # delivered asynchronously
            time.sleep(0.01)
        watcher, latest = _watch_a_silent_rank_2(tmp_path, proc.pid)
    finally:
        proc.kill()
        proc.wait()
    (f,) = latest["verdict"]["findings"]
    assert (latest["verdict"]["status"], f["kind"], f["culprit_ranks"], f["seq"]) == (
        "stuck", "rank_frozen", [2], 4)
    assert "its process was alive at the stall" in f["detail"]
    assert [(p["rank"], p["state"]) for p in watcher.probes] == [(2, "stopped")]


def test_the_last_heartbeat_of_a_log_still_written_is_found_past_its_padding(tmp_path):
    from comm2perfetto.sources.event_log import last_heartbeat

    lines = [{"kind": "header", "format": "comm2perfetto-events", "version": 1}, ["h", T0], ["b", 1, T0 + 5],
             ["h", T0 + 10**9], ["w", T0 + 2 * 10**9, "some warning"]]
    path = tmp_path / layout.event_log(0)
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines) + b"\0" * 4096)  # a live mapping's padding
    assert last_heartbeat(path) == (T0 + 10**9, False)
    path.write_bytes(path.read_bytes().replace(b"some warning", b"comm2perfetto: recording disabled on rank 0"))
    assert last_heartbeat(path) == (T0 + 10**9, True)
    (tmp_path / "empty").write_bytes(b"")
    assert last_heartbeat(tmp_path / "empty") == (None, False)


def _groups_rank(rank: int, groups: dict, complete: bool = True) -> dict:
    """A rank summary listing ``groups``: name -> (desc, members, issued, pending (op, seq) or None)."""
    out = {}
    for name, (desc, members, issued, pending) in groups.items():
        p = None if pending is None else {"op": pending[0], "seq": pending[1], "since_ns": T0, "source": "patch"}
        out[name] = {"desc": desc, "ranks": list(members), "issued": issued, "pending": p}
    return {"rank": rank, "host": "node0", "pid": 100 + rank, "t_ns": T0, "step": 1, "groups": out,
            "groups_complete": complete, "stack": [f"train.py:{50 + rank} main"]}


def test_ranks_that_created_their_groups_in_another_order_are_a_group_mismatch_never_ok(tmp_path):
    """Rank 2 created Y before X: its X is c10d group 2, the others' group 1. Every rank waits, each in its own
    X; rank 2 never used its group 1 (Y), which a complete summary lists with nothing issued."""
    members = (0, 1, 2)
    usual = {"0": ("default_pg", members, 1, None), "1": ("X", members, 1, ("all_reduce", 1)),
             "2": ("Y", members, 0, None)}
    swapped = {"0": ("default_pg", members, 1, None), "1": ("Y", members, 0, None),
               "2": ("X", members, 1, ("all_reduce", 1))}
    d = _verdict(tmp_path, _snapshot(_groups_rank(0, usual), _groups_rank(1, usual), _groups_rank(2, swapped)))
    assert d.status == "desync"
    first, *rest = d.findings
    assert (first.kind, first.culprit_ranks, first.suspect_ranks) == ("group_mismatch", (), (0, 1, 2))
    assert "X is group 1 on ranks 0, 1 and group 2 on rank 2" in first.detail
    assert "Rank 2 created its groups in another order than ranks 0, 1." in first.detail
    assert rest and all(f.blocked_by == 1 and not f.culprit_ranks and not f.suspect_ranks for f in rest)
    labels = {f.process_group for f in rest}
    assert len(labels) == len(rest)  # the two groups are told apart
    assert {r: a.state for r, a in d.ranks.items()} == {0: "blocked", 1: "blocked", 2: "blocked"}


def test_a_group_a_rank_lists_nothing_of_while_listing_every_group_is_one_it_issued_nothing_in(tmp_path):
    """Rank 1 answered and listed all of its groups: without group 5 there, it has issued nothing in it."""
    members = (0, 1)
    waiting = {"0": ("default_pg", members, 2, None), "5": ("tp", members, 1, ("all_reduce", 1))}
    d = _verdict(tmp_path, _snapshot(_groups_rank(0, waiting), _groups_rank(1, {"0": ("default_pg", members, 2, None)}),
                                     world=2))
    (f,) = d.findings
    assert (d.status, f.kind, f.culprit_ranks, f.ranks_missing) == ("stuck", "missing_ranks", (1,), (1,))


def test_without_a_complete_list_a_group_a_rank_does_not_list_is_unknown_not_fine(tmp_path):
    members = (0, 1)
    waiting = {"0": ("default_pg", members, 2, None), "5": ("tp", members, 1, ("all_reduce", 1))}
    d = _verdict(tmp_path, _snapshot(
        _groups_rank(0, waiting), _groups_rank(1, {"0": ("default_pg", members, 2, None)}, complete=False), world=2))
    (f,) = d.findings
    assert (d.status, f.kind, f.culprit_ranks, f.suspect_ranks) == ("stuck", "no_dump", (), (1,))


def test_a_frozen_rank_and_a_rank_computing_elsewhere_are_both_accounted_for(tmp_path):
    """Ranks 0 and 2 wait in all_reduce #4 for ranks 1 and 3: rank 3 did not answer (its process stopped), rank 1
    answered from its data loader. Both are named; every rank has a place in the verdict."""
    members = (0, 1, 2, 3)
    d = live_diagnosis(read_snapshot(str(_write(tmp_path, "s.json", _snapshot(
        _rank(0, 4, ("all_reduce", 4, 0.0), members=members), _rank(1, 3, None, ["loader.py:12 next"], members=members),
        _rank(2, 4, ("all_reduce", 4, 0.1), members=members), world=4)))),
        {3: {"state": "stopped", "detail": "stopped (SIGSTOP, process state T)"}})
    assert sorted((str(f.kind), f.culprit_ranks) for f in d.findings) == [("missing_ranks", (1,)),
                                                                         ("rank_frozen", (3,))]
    assert {r: a.state for r, a in d.ranks.items()} == {0: "blocked", 1: "outside", 2: "blocked", 3: "frozen"}
    assert d.ranks[1].where == "awaited in all_reduce #4 on default_pg"


def test_a_silent_rank_whose_recorder_never_ran_while_its_process_runs_is_frozen(tmp_path):
    """A rank that holds the GIL from its first second never writes a heartbeat: its process runs (burning CPU
    in a catastrophic regex, as a C extension loop would) while its log shows no sign of its recorder's thread."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import re; re.match(r'(a+)+$', 'a' * 64 + 'b')"])
    try:
        watcher, latest = _watch_a_silent_rank_2(tmp_path, proc.pid, wall_ns=time.time_ns() - 5 * 10**9)
    finally:
        proc.kill()
        proc.wait()
    (f,) = latest["verdict"]["findings"]
    assert (latest["verdict"]["status"], f["kind"], f["culprit_ranks"]) == ("stuck", "rank_frozen", [2])
    assert "its recorder's thread has not run once since it started" in f["detail"]
    assert "it holds the GIL" in f["detail"]
    assert [(p["rank"], p["state"]) for p in watcher.probes] == [(2, "held")]


class _StalledRank:
    """The recorder as the watchdog sees it at a stall: nothing in flight."""

    rank = 0

    def __init__(self):
        self.failed_calls: set[int] = set()
        self.uncaught = False

    def in_flight(self):
        return []


class _ToldResolved:
    """The live verdict's side: which stalls were told resolved."""

    def __init__(self):
        self.resolved_gens: list[int] = []

    def resolved(self, gen):
        self.resolved_gens.append(gen)

    def write_resolved(self):
        pass


@pytest.mark.parametrize("raised, resolved", [(False, [7]), (True, [])])
def test_a_stall_is_resolved_by_its_call_completing_never_by_its_call_raising(raised, resolved):
    """The call that triggered stall 7 left the calls in flight: it completed (the stall resolved, the job went
    on), or it raised (gloo's timeout, a broken connection: the job did not go on). Also at the recorder's stop."""
    from comm2perfetto.record.watchdog import Watchdog

    rec, live = _StalledRank(), _ToldResolved()
    rec.failed_calls = {42} if raised else set()
    dog = Watchdog(rec, _Store(), None, ".", live=live)
    dog._open_stalls[42] = 7
    dog.stop()  # never started: the stop's last look alone
    assert live.resolved_gens == resolved


@pytest.mark.parametrize("uncaught, resolved", [(False, [7]), (True, [])])
def test_a_cpp_collectives_stall_is_resolved_a_tick_after_it_ended_unless_an_exception_ends_the_rank(
        uncaught, resolved):
    """Stall 7 was a collective only Flight Recorder sees (DDP's broadcast). It ended: completed, or raised
    gloo's timeout, whose exception reaches Python a moment later. The first look after it ended tells nothing;
    the next tells it resolved, unless an uncaught exception came first (the job did not go on)."""
    from comm2perfetto.record.watchdog import Watchdog

    rec, live = _StalledRank(), _ToldResolved()
    dog = Watchdog(rec, _Store(), None, ".", live=live)
    item = (("fr", "0", "coll"), 6)
    dog._open_stalls[item] = 7
    dog._check_resolved()
    assert live.resolved_gens == []  # ended at this look: not yet told
    rec.uncaught = uncaught
    dog._check_resolved()
    assert live.resolved_gens == resolved
    assert item not in dog._open_stalls


@pytest.mark.parametrize("passed, kind, told", [
    ({0: (16, ["Float"]), 1: (17, ["Float"]), 2: (16, ["Float"])}, "size_mismatch", "rank 1: all_reduce 17 elements"),
    ({0: (16, ["Float"]), 1: (16, ["Double"]), 2: (16, ["Float"])}, "dtype_mismatch",
     "rank 1: all_reduce 16 elements Double"),
])
def test_ranks_waiting_in_one_collective_with_other_sizes_or_dtypes_disagree(tmp_path, passed, kind, told):
    """Every rank waits in all_reduce #7 (gloo hangs rather than aborts): what each passed tells a mismatch
    from a stuck collective; without history, every waiting rank is a suspect."""
    ranks = [_rank(r, 7, ("all_reduce", 7, 0.1 * r)) for r in range(3)]
    for r, summary in enumerate(ranks):
        summary["groups"]["0"]["pending"]["numel"], summary["groups"]["0"]["pending"]["dtypes"] = passed[r]
    d = _verdict(tmp_path, _snapshot(*ranks))
    (f,) = d.findings
    assert (d.status, f.kind, f.culprit_ranks, f.suspect_ranks) == ("desync", kind, (), (0, 1, 2))
    assert told in f.detail


def test_a_pending_entry_without_sizes_is_no_mismatch(tmp_path):
    """Flight Recorder's pending entries (DDP's collectives) carry no sizes: unknown is not different."""
    ranks = [_rank(r, 7, ("all_reduce", 7, 0.0)) for r in range(3)]
    ranks[0]["groups"]["0"]["pending"].update(numel=16, dtypes=["Float"])
    (f,) = _verdict(tmp_path, _snapshot(*ranks)).findings
    assert f.kind == "stuck_all_joined"


def test_a_rank_that_went_past_a_collective_with_another_size_is_a_suspect_of_the_mismatch(tmp_path):
    """Rank 2 passed 5 elements to all_reduce #3 where ranks 0 and 1 passed 8: gloo let rank 2 through, and it
    waits in #4 while the others hang in #3. Its recent collectives say what it passed to #3: a size mismatch,
    every rank of it a suspect; not a collective stuck with nothing to blame."""
    ranks = [_rank(r, 3, ("all_reduce", 3, 0.1 * r)) for r in range(2)] + [_rank(2, 4, ("all_reduce", 4, 0.3))]
    for r in range(2):
        ranks[r]["groups"]["0"]["pending"].update(numel=8, dtypes=["Float"])
    ranks[2]["groups"]["0"]["pending"].update(numel=8, dtypes=["Float"])
    ranks[2]["groups"]["0"]["recent"] = [[2, T0, "all_reduce", 8], [3, T0 + 10**8, "all_reduce", 5],
                                         [4, T0 + 3 * 10**8, "all_reduce", 8]]
    d = _verdict(tmp_path, _snapshot(*ranks))
    [f] = [f for f in d.findings if f.blocked_by is None]
    assert (d.status, f.kind, f.seq, f.culprit_ranks, f.suspect_ranks) == ("desync", "size_mismatch", 3, (), (0, 1, 2))
    assert "rank 2: all_reduce 5 elements" in f.detail and "Rank 2 went past it" in f.detail
    # without what rank 2 passed, nothing shows a mismatch: stuck, nobody blamed
    ranks[2]["groups"]["0"]["recent"] = [[3, T0 + 10**8], [4, T0 + 3 * 10**8]]
    [f] = [f for f in _verdict(tmp_path, _snapshot(*ranks)).findings if f.blocked_by is None]
    assert (f.kind, f.culprit_ranks, f.suspect_ranks) == ("stuck_all_joined", (), ())
