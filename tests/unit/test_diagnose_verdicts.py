"""The rules that make a verdict follow from evidence: dead ranks, interruptions, jobs still running, partial
data, no collectives, job identity. Built logs and dumps; the fault matrix (integration) runs real jobs."""

from __future__ import annotations

import json

import pytest

from comm2perfetto.diagnose.diagnosis import diagnose
from comm2perfetto.diagnose.endings import DIED, EXCEPTION, PEER_LOST, RUNNING, SIGNALLED, rank_ends
from comm2perfetto.match import load_job
from comm2perfetto.sources.checks import MixedJobsError
from support.factories import T0_NS, EventLog, FrJob, steady_job

S = 10**9
RESET = "RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:39090: Connection reset by peer"


def _logs(world: int = 2, steps: int = 5, gap_ns: int = S // 10) -> list[EventLog]:
    """Every rank all-reduced ``steps`` times, one every ``gap_ns``, with heartbeats meanwhile."""
    logs = []
    for r in range(world):
        log = EventLog(rank=r, world=world)
        log.group(0, "0", "default_pg", list(range(world)))
        for i in range(steps):
            log.step(i, T0_NS + i * gap_ns)
            log.call("all_reduce", T0_NS + i * gap_ns + r * 1000, seq=i + 1, shapes=[[4]], dtypes=["Float"])
        logs.append(log)
    return logs


def _verdict(tmp_path, logs, *, crashed=(), now_ns=None, jobs=()):
    for log in logs:
        log.write(tmp_path, crashed=log.rank in crashed)
    for i, j in enumerate(jobs):
        (tmp_path / f"job.node01.{i}.json").write_text(json.dumps({"format": "comm2perfetto-job", **j}))
    job = load_job([tmp_path])
    d = diagnose(job, now_ns=now_ns)
    return d, [(f.kind, f.seq, f.culprit_ranks) for f in d.findings], job


def test_healthy_logs_are_ok(tmp_path):
    logs = _logs()
    for log in logs:
        log.close(T0_NS + S)
    d, found, _ = _verdict(tmp_path, logs)
    assert (d.status, found, d.healthy) == ("ok", [], True)


def test_a_killed_rank_is_crashed_and_its_peers_failures_follow(tmp_path):
    logs = _logs()
    logs[1].heartbeats(T0_NS + S // 2)  # then SIGKILL: its log stops, unclosed
    t = T0_NS + S
    logs[0].call("all_reduce", t, seq=6, shapes=[[4]], dtypes=["Float"], error=RESET)  # it waited, then failed
    logs[0].ending(t + 1000, "exception", RESET)
    logs[0].close(t + 2000)
    d, found, job = _verdict(tmp_path, logs, crashed={1}, jobs=[{"host": "node01", "ended_ns": t + S,
                                                                "exit_status": 1}])
    assert {r: e.how for r, e in rank_ends(job).items()} == {0: PEER_LOST, 1: DIED}
    assert (d.status, found) == ("crashed", [("rank_died", 6, (1,))])
    (f,) = d.findings
    assert f.ranks_joined == (0,) and f.evidence["step"] == 4
    assert f.evidence["last_collective"] == {"process_group": "default_pg", "seq": 5, "op": "all_reduce"}
    assert "Rank 1 died" in f.detail and "Connection reset by peer" in f.detail
    assert not d.healthy


def test_an_uncaught_exception_of_a_rank_is_its_death(tmp_path):
    logs = _logs()
    t = T0_NS + S
    logs[1].ending(t, "exception", "ValueError: bad batch")
    logs[1].close(t + 10)
    logs[0].call("all_reduce", t - S // 2, seq=6, shapes=[[4]], dtypes=["Float"], error=RESET, dur_ns=S // 2 + 100)
    logs[0].ending(t + 200, "exception", RESET)
    logs[0].close(t + 300)
    d, found, job = _verdict(tmp_path, logs)
    assert rank_ends(job)[1].how == EXCEPTION
    assert (d.status, found) == ("crashed", [("rank_died", 6, (1,))])
    assert "uncaught ValueError: bad batch" in d.findings[0].detail


def test_a_rank_gone_silently_is_found_from_its_peers_timeouts(tmp_path):
    """Rank 1's node went down: no heartbeats were written (an old recorder), its log is unclosed, and rank 0's
    all-reduce timed out. The unclosed log is the peer that went; a timeout is a victim's error."""
    logs = _logs()
    t = T0_NS + 30 * S
    timeout = "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms for recv"
    logs[0].call("all_reduce", T0_NS + S, seq=6, shapes=[[4]], dtypes=["Float"], error=timeout, dur_ns=29 * S)
    logs[0].ending(t, "exception", timeout)
    logs[0].close(t + 100)
    d, found, job = _verdict(tmp_path, logs, crashed={1})
    assert {r: e.how for r, e in rank_ends(job).items()} == {0: PEER_LOST, 1: "unknown"}
    assert (d.status, found) == ("crashed", [("rank_died", 6, (1,))])


def _interrupted(logs, t_sig, waiting_since):
    """Rank 1 got SIGINT at ``t_sig`` between collectives; rank 0 had been waiting in #6 since ``waiting_since``
    and got it 0.5 s later."""
    logs[1].ending(t_sig, "signal", "SIGINT")
    logs[1].close(t_sig + 1000, "signal")
    logs[0].call("all_reduce", waiting_since, seq=6, shapes=[[4]], dtypes=["Float"],
                 error="KeyboardInterrupt: ", dur_ns=t_sig + S // 2 - waiting_since)
    logs[0].ending(t_sig + S // 2, "signal", "SIGINT")
    logs[0].close(t_sig + S // 2 + 1000, "signal")


def test_ctrl_c_of_a_healthy_job_is_interrupted_not_a_hang(tmp_path):
    logs = _logs()
    t_sig = T0_NS + S
    _interrupted(logs, t_sig, waiting_since=t_sig + 1000)  # rank 1 stopped because it got the signal first
    d, found, job = _verdict(tmp_path, logs, jobs=[{"host": "node01", "ended_ns": t_sig + S, "exit_status": 130,
                                                     "signal": "SIGINT", "signal_ns": t_sig}])
    assert {e.how for e in rank_ends(job).values()} == {SIGNALLED}
    assert (d.status, found, d.healthy) == ("interrupted", [], True)
    assert any("left unfinished by the interruption" in n for n in d.notes)


def test_a_hang_the_user_then_interrupts_is_still_the_hang(tmp_path):
    logs = _logs()
    t_sig = T0_NS + 20 * S
    _interrupted(logs, t_sig, waiting_since=T0_NS + S)  # rank 0 waited 19 s for rank 1 before Ctrl-C
    d, found, _ = _verdict(tmp_path, logs)
    assert (d.status, found) == ("stuck", [("missing_ranks", 6, (1,))])
    assert any("a hang the interruption ended" in n for n in d.notes)


@pytest.mark.parametrize("pending_s, stall_record, expected", [
    (1, False, ("running", [])),  # a collective in progress
    (120, False, ("stuck", [("missing_ranks", 6, (1,))])),  # past the default 60 s stall threshold
    (5, True, ("stuck", [("missing_ranks", 6, (1,))])),  # the recorder saw a stall
])
def test_a_job_still_running(tmp_path, pending_s, stall_record, expected):
    logs = _logs()
    now = T0_NS + 200 * S
    since = now - pending_s * S
    logs[0].call("all_reduce", since, seq=6, shapes=[[4]], dtypes=["Float"], returns=False)
    if stall_record:
        logs[0].stall(since + S)
    for log in logs:
        log.heartbeats(now - S // 2)
    d, found, job = _verdict(tmp_path, logs, crashed={0, 1}, now_ns=now)  # unclosed: still being written
    assert {e.how for e in rank_ends(job, now).values()} == {RUNNING}
    assert (d.status, found) == expected


def test_a_log_whose_heartbeats_stopped_long_ago_is_a_dead_rank(tmp_path):
    logs = _logs()
    logs[0].heartbeats(T0_NS + 100 * S)
    logs[1].heartbeats(T0_NS + 10 * S)
    _d, _found, job = _verdict(tmp_path, logs, crashed={0, 1})
    ends = rank_ends(job, now_ns=T0_NS + 100 * S)
    assert (ends[0].how, ends[1].how) == (RUNNING, DIED)


def test_a_whole_job_killed_at_once_names_no_dead_culprit(tmp_path):
    logs = _logs()
    logs[0].call("all_reduce", T0_NS + S, seq=6, shapes=[[4]], dtypes=["Float"], returns=False)
    for log in logs:
        log.heartbeats(T0_NS + 5 * S)
    d, found, _ = _verdict(tmp_path, logs, crashed={0, 1}, jobs=[{"host": "node01", "ended_ns": T0_NS + 6 * S}])
    assert (d.status, found) == ("stuck", [("missing_ranks", 6, (1,))])
    assert any("the whole job was killed at once" in n for n in d.notes)


def test_stall_seen_by_one_rank_while_the_other_left_no_data_names_the_pending_collective(tmp_path):
    """Node 0's folder alone: rank 0 waits in #6 and logged the stall; rank 1's files are elsewhere."""
    (log, _other) = _logs()
    log.call("all_reduce", T0_NS + S, seq=6, shapes=[[4]], dtypes=["Float"], returns=False)
    log.stall(T0_NS + 3 * S)
    log.heartbeats(T0_NS + 5 * S)
    d, found, _ = _verdict(tmp_path, [log], crashed={0})
    assert (d.status, found) == ("incomplete", [("no_dump", 6, ())])
    assert d.findings[0].suspect_ranks == (1,)


def test_dumps_without_collectives_are_incomplete(tmp_path):
    FrJob(world=2, backend="gloo").write(tmp_path)  # every rank's dump holds no entry
    d = diagnose(load_job([tmp_path]))
    assert (d.status, [f.kind for f in d.findings]) == ("incomplete", ["no_collectives"])
    assert "torch 2.4 to 2.7" in d.findings[0].detail and not d.healthy


def test_logs_without_sequence_numbers_are_matched_by_order(tmp_path):
    """A group whose backend keeps no sequence counter: its collectives meet by their order on each rank."""
    logs = [EventLog(rank=r, world=2, backend="custom") for r in (0, 1)]
    for log in logs:
        log.group(0, "0", "default_pg", [0, 1])
        log.call("all_reduce", T0_NS, seq=None, shapes=[[4]], dtypes=["Float"])
        log.close(T0_NS + S)
    d, found, _ = _verdict(tmp_path, logs)
    assert (d.status, found) == ("ok", [])
    assert any("matched across ranks by their order" in note for note in d.notes)


def test_a_rank_that_never_issued_an_unnumbered_collective_is_named(tmp_path):
    logs = [EventLog(rank=r, world=2, backend="custom") for r in (0, 1)]
    for log in logs:
        log.group(0, "0", "default_pg", [0, 1])
        log.call("all_reduce", T0_NS, seq=None, shapes=[[4]], dtypes=["Float"])
    logs[0].call("all_reduce", T0_NS + S, seq=None, shapes=[[4]], dtypes=["Float"], returns=False)
    logs[0].stall(T0_NS + 3 * S)
    for log in logs:
        log.heartbeats(T0_NS + 5 * S)
    _d, found, _ = _verdict(tmp_path, logs, now_ns=T0_NS + 5 * S)
    assert found == [("missing_ranks", 2, (1,))]


def test_unreadable_dumps_count_as_ranks_without_data(tmp_path):
    job = steady_job(world=4, steps=4)
    job.write(tmp_path)
    for r in (1, 2, 3):
        p = tmp_path / f"nccl_trace_rank_{r}"
        p.write_bytes(p.read_bytes()[:40])
    d = diagnose(load_job([tmp_path]))
    assert (d.status, [(f.kind, f.culprit_ranks, f.suspect_ranks) for f in d.findings]) == (
        "incomplete", [("no_dump", (), (1, 2, 3))])


def test_the_same_path_twice_is_read_once(tmp_path):
    logs = _logs()
    for log in logs:
        log.close(T0_NS + S)
        log.write(tmp_path)
    job = load_job([tmp_path, str(tmp_path) + "/", tmp_path / "rank0.events.jsonl"])
    assert diagnose(job).status == "ok"


def _node_logs(tmp_path, headers):
    for rank, extra in enumerate(headers):
        (log,) = [x for x in _logs() if x.rank == rank]
        log.lines[0].update(extra)
        log.close(T0_NS + S)
        log.write(tmp_path / f"node{rank}")
    return [tmp_path / "node0", tmp_path / "node1"]


def test_one_record_per_node_is_one_job(tmp_path):
    """Each node's `record` made its own run id; torchrun's run id and the rendezvous endpoint are shared."""
    paths = _node_logs(tmp_path, [{"run_id": "a-1", "torchelastic_run_id": "job7", "master": "n0:29500"},
                                  {"run_id": "b-2", "torchelastic_run_id": "job7", "master": "n0:29500"}])
    assert diagnose(load_job(paths)).status == "ok"


def test_logs_of_two_runs_are_refused(tmp_path):
    paths = _node_logs(tmp_path, [{"run_id": "a-1", "torchelastic_run_id": "x", "master": "n0:1"},
                                  {"run_id": "b-2", "torchelastic_run_id": "y", "master": "n0:2"}])
    with pytest.raises(MixedJobsError, match="different runs"):
        load_job(paths)


def test_plain_dumps_of_two_runs_are_refused(tmp_path):
    first, second = steady_job(world=2, steps=6), steady_job(world=2, steps=6)
    first.write(tmp_path / "a")
    second.write(tmp_path / "b")
    (tmp_path / "b" / "nccl_trace_rank_0").unlink()
    (tmp_path / "a" / "nccl_trace_rank_1").unlink()
    # The same run: accepted.
    load_job([tmp_path / "a", tmp_path / "b"])
    # Rank 1 from a run 10 minutes later: every shared collective lies minutes apart.
    later = steady_job(world=2, steps=6)
    for entry in later.entries[1]:
        entry["time_created_ns"] += 600 * S
    later.write(tmp_path / "c")
    (tmp_path / "c" / "nccl_trace_rank_0").unlink()
    with pytest.raises(MixedJobsError, match="different runs"):
        load_job([tmp_path / "a", tmp_path / "c"])


def test_a_stall_that_shows_nothing_does_not_hide_a_later_one(tmp_path):
    """A first stall (a slow start the job got over) shows no missing rank; the next one shows rank 1 away."""
    logs = _logs()
    logs[0].stall(T0_NS + S // 20)  # while both ranks were in #1, which completed
    t = T0_NS + S
    logs[0].call("all_reduce", t, seq=6, shapes=[[4]], dtypes=["Float"], dur_ns=4 * S)
    logs[0].stall(t + 2 * S)
    logs[1].call("all_reduce", t + 4 * S, seq=6, shapes=[[4]], dtypes=["Float"])
    for log in logs:
        log.close(t + 5 * S)
    d, found, _ = _verdict(tmp_path, logs)
    assert (d.status, found) == ("ok", [("missing_ranks", 6, (1,))])  # resolved: the job went on
    assert d.findings[0].resolved


def test_ranks_the_launcher_kills_after_the_first_death_are_its_victims_not_deaths(tmp_path):
    """Rank 1 is SIGKILLed; ranks 0 and 2 wait in all_reduce #6 for it, and torchrun SIGKILLs them 30 s later
    (its grace period after SIGTERM, which a rank blocked in gloo never handles)."""
    logs = _logs(world=3)
    logs[1].heartbeats(T0_NS + S // 2)  # then SIGKILL: its log stops, unclosed
    t = T0_NS + S
    for r in (0, 2):
        logs[r].call("all_reduce", t + r * 1000, seq=6, shapes=[[4]], dtypes=["Float"], returns=False)
        logs[r].heartbeats(t + 30 * S)  # alive and waiting until the launcher's SIGKILL
    d, found, _ = _verdict(tmp_path, logs, crashed={0, 1, 2},
                           jobs=[{"host": "node01", "ended_ns": t + 31 * S, "exit_status": 1}])
    assert (d.status, found) == ("crashed", [("rank_died", 6, (1,))])
    (f,) = d.findings
    assert f.victim_ranks == (0, 2)
    assert "Ranks 0, 2 ended 30.6 s later, still inside their call" in f.detail  # after rank 1's last record
    assert {r: a.state for r, a in d.ranks.items()} == {0: "victim", 1: "dead", 2: "victim"}
    assert d.to_json()["victim_ranks"] == [0, 2]


def test_a_rank_that_dies_later_outside_any_call_is_a_suspect_not_a_second_culprit(tmp_path):
    """Not waiting when it died, 19.6 s after rank 1 (its last record): the launcher stopping the job, or a fault
    of its own, the data cannot tell: a suspect, never a culprit that "ended first"."""
    logs = _logs(world=3)
    logs[1].heartbeats(T0_NS + S // 2)
    logs[2].heartbeats(T0_NS + 20 * S)  # computing, outside any call, until it dies too
    logs[0].heartbeats(T0_NS + 40 * S)
    logs[0].close(T0_NS + 40 * S)
    d, found, _ = _verdict(tmp_path, logs, crashed={1, 2},
                           jobs=[{"host": "node01", "ended_ns": T0_NS + 41 * S, "exit_status": 1}])
    assert d.status == "crashed" and sorted(k for k, _, _ in found) == ["rank_died", "rank_died"]
    assert sorted(c for _, _, c in found) == [(), (1,)]
    later = next(f for f in d.findings if f.suspect_ranks == (2,))
    assert later.basis.startswith("it died 19.6 s after rank 1's failure, outside any call")


def _died_inside(tmp_path, sizes: dict[int, list], exits: list | None = None):
    """Three ranks loop all_reduce [[4]] five times; at #6 each passes ``sizes[rank]``, rank 2's log stops inside
    the call (gloo's SIGABRT: no Python handler runs) and ranks 0 and 1 fail with a reset connection. ``exits``:
    what `record` saw of the processes' ends (none by default)."""
    logs = _logs(world=3)
    t = T0_NS + S
    for r in range(3):
        error = RESET if r != 2 else None
        logs[r].call("all_reduce", t + r * 1000, seq=6, shapes=sizes[r], dtypes=["Float"], error=error,
                     returns=r != 2)
        if r != 2:
            logs[r].ending(t + S // 10, "exception", RESET)
            logs[r].close(t + S // 5)
    return _verdict(tmp_path, logs, crashed={2},
                    jobs=[{"host": "node01", "ended_ns": t + S, "exit_status": 1, "exits": exits or []}])


def test_a_rank_that_died_inside_a_collective_every_rank_joined_is_a_suspect_not_the_cause(tmp_path):
    d, found, _ = _died_inside(tmp_path, {0: [[4]], 1: [[4]], 2: [[4]]})
    assert (d.status, found) == ("crashed", [("rank_died", 6, ())])
    (f,) = d.findings
    assert (f.suspect_ranks, f.victim_ranks, f.ranks_joined, f.ranks_missing) == ((2,), (0, 1), (0, 1, 2), ())
    assert "It ended inside all_reduce #6 on default_pg, which ranks 0, 1 had joined too" in f.detail


def test_a_rank_that_died_inside_a_mismatched_collective_is_the_mismatch_s_victim(tmp_path):
    """Rank 0 broke its own cycle ([[4]] five times, then [[8]]): it is the culprit; rank 2, which gloo aborted
    for receiving more than it expected, is a victim."""
    d, found, _ = _died_inside(tmp_path, {0: [[8]], 1: [[4]], 2: [[4]]})
    assert (d.status, found) == ("desync", [("size_mismatch", 6, (0,))])
    (f,) = d.findings
    assert f.victim_ranks == (2,)
    assert d.ranks[2].state == "victim"


def test_a_rank_seen_frozen_at_the_stall_stays_frozen_when_the_interruption_unblocks_it(tmp_path):
    """Rank 1 held the GIL from its start (no heartbeat, no call); `record` saw it running with its recorder
    silent at the stall ("held"); Ctrl-C then raised KeyboardInterrupt in it, and it wrote its way out."""
    logs = _logs(world=2, steps=0)
    t = T0_NS + S
    logs[0].call("all_reduce", t, seq=1, shapes=[[4]], dtypes=["Float"], returns=False)
    logs[0].stall(t + 2 * S, cid=1)
    logs[0].heartbeats(t + 10 * S)
    for log in logs:
        log.ending(t + 10 * S, "signal", "SIGINT")
        log.close(t + 10 * S + 1000)
    probe = {"rank": 1, "pid": 4001, "state": "held", "t_ns": t + 6 * S, "attempt": 0}
    d, found, _ = _verdict(tmp_path, logs, jobs=[{"host": "node01", "ended_ns": t + 11 * S, "exit_status": 1,
                                                 "signal": "SIGINT", "signal_ns": t + 10 * S, "probes": [probe]}])
    assert (d.status, found) == ("stuck", [("rank_frozen", 1, (1,))])
    assert "running while its recorder's thread did not (the GIL held)" in d.findings[0].detail


def test_stacks_a_rank_wrote_on_its_way_out_are_not_its_stack_at_the_stall(tmp_path):
    """Rank 1 could only answer the stall's stack request once the interruption unblocked it, 9 s later, from
    its exit path: that stack (threading.join) is not what it was doing at the stall, and is not shown."""
    from support.factories import stacks_file

    logs = _logs(world=2, steps=0)
    t = T0_NS + S
    logs[0].call("all_reduce", t, seq=1, shapes=[[4]], dtypes=["Float"], returns=False)
    logs[0].stall(t + 2 * S, cid=1, stacks_file="rank0.stacks.1.json")
    logs[1].ending(t + 10 * S, "signal", "SIGINT")
    logs[1].stall(t + 10 * S + 100, reason="remote", stacks_file="rank1.stacks.1.json")
    for log in logs:
        log.close(t + 11 * S)
    stacks_file(tmp_path, 0, [("job.py", 8, "<module>")], t + 2 * S - 1000)
    stacks_file(tmp_path, 1, [("threading.py", 1123, "join")], t + 10 * S + 50)
    _d, _found, job = _verdict(tmp_path, logs)
    assert set(job.stall_stacks) == {0}


def test_a_receive_left_waiting_by_a_frozen_rank_is_its_freeze_not_a_desync(tmp_path):
    """A 0 -> 1 pipeline: rank 0 is stopped (SIGSTOP) before its send; rank 1 waits in its receive from it. The
    unmatched receive is the wait the freeze left behind: stuck, rank 0 frozen, no p2p desync."""
    logs = _logs(world=2, steps=2)
    t = T0_NS + S
    logs[1].call("recv", t, peer=0, shapes=[[4]], dtypes=["Float"], returns=False)
    logs[1].heartbeats(t + 10 * S)
    logs[0].heartbeats(t - S // 2)
    probe = {"rank": 0, "pid": 4000, "state": "stopped", "t_ns": t + 8 * S, "attempt": 0}
    d, found, _ = _verdict(tmp_path, logs, crashed={0, 1},  # then Ctrl-C: torchrun SIGKILLs both 30 s later
                           jobs=[{"host": "node01", "ended_ns": t + 11 * S, "exit_status": 1, "probes": [probe],
                                  "signal": "SIGINT", "signal_ns": t + 9 * S}])
    assert (d.status, [k for k, _, _ in found]) == ("stuck", ["rank_frozen"]), found
    (f,) = d.findings
    assert f.culprit_ranks == (0,) and "Rank 1 waits in recv on default_pg for it" in f.detail


def test_a_teardown_within_a_heartbeat_of_the_first_death_is_still_the_launcher_s(tmp_path):
    """Rank 1 aborts between collectives; torchrun kills ranks 0 and 2, waiting in all_reduce #6 for it, 50 ms
    later (SIGTERM ends a rank blocked in gloo at once): every log stops within a heartbeat, but the launcher
    reported the failure (exit status 1, no signal forwarded), and only rank 1 died outside a call."""
    logs = _logs(world=3)
    t = T0_NS + S
    logs[1].heartbeats(t)
    for r in (0, 2):
        logs[r].call("all_reduce", t - S // 2 + r * 1000, seq=6, shapes=[[4]], dtypes=["Float"], returns=False)
        logs[r].heartbeats(t + 50_000_000 - S + 1)
    d, found, _ = _verdict(tmp_path, logs, crashed={0, 1, 2},
                           jobs=[{"host": "node01", "ended_ns": t + S, "exit_status": 1}])
    assert (d.status, found) == ("crashed", [("rank_died", 6, (1,))])
    assert d.findings[0].victim_ranks == (0, 2)


def test_ranks_that_died_within_a_heartbeat_of_each_other_are_suspects_not_culprits(tmp_path):
    """Ranks 1 and 2 both stop right after all_reduce #5, 0.6 ms apart, outside any call (one aborted, gloo
    then aborted the other): a log's last record may precede its death by a heartbeat, so which died first is
    not known."""
    logs = _logs(world=3)
    t = T0_NS + S
    logs[0].call("broadcast", t, seq=6, shapes=[[4]], dtypes=["Float"], error=RESET)
    logs[0].ending(t + 1000, "exception", RESET)
    logs[0].close(t + 2000)
    d, found, _ = _verdict(tmp_path, logs, crashed={1, 2},
                           jobs=[{"host": "node01", "ended_ns": t + S, "exit_status": 1}])
    assert d.status == "crashed" and [c for _, _, c in found] == [(), ()]
    assert d.to_json()["suspect_ranks"] == [1, 2]
    assert "which died first, and took the others down, cannot be told" in d.findings[0].basis
    assert all("failures follow from it" not in f.action and "cannot be told" in f.action for f in d.findings)


def _exit(rank: int, alive_ns: int | None, t_ns: int, signal: str | None = None, status: int | None = None):
    """An entry of the job file's ``exits`` (what `record` saw of a rank's process ending)."""
    return {"rank": rank, "pid": 4000 + rank, "attempt": 0, "alive_ns": alive_ns, "t_ns": t_ns, "signal": signal,
            "status": status}


def _ddp_deaths(tmp_path, exits, *, cpp_calls: bool = False):
    """DDP's gradient all-reduces come from C++, so no call is open in either log: rank 0 is SIGKILLed and torchrun
    stops rank 1 while it computes; both logs stop 1 ms apart, well within a heartbeat. ``cpp_calls``: the logs'
    sequence numbers skip the C++-issued collectives (and no Flight Recorder dump shows them)."""
    logs = _logs(world=2)
    if cpp_calls:
        for log in logs:
            log.call("all_reduce", T0_NS + S // 2, seq=8, shapes=[[4]], dtypes=["Float"])  # #6 and #7 from C++
    t = T0_NS + S
    logs[0].heartbeats(t)
    logs[1].heartbeats(t + 1_000_000)
    return _verdict(tmp_path, logs, crashed={0, 1},
                    jobs=[{"host": "node01", "ended_ns": t + S, "exit_status": 1, "exits": exits}])


def test_deaths_record_saw_in_order_name_the_first_and_the_ranks_the_launcher_stopped(tmp_path):
    t = T0_NS + S
    d, found, job = _ddp_deaths(tmp_path, [_exit(0, t, t + 2_000_000, "SIGKILL"),
                                           _exit(1, t + 3_000_000, t + 35_000_000, "SIGTERM")])
    assert job.ranks[1].exit.before(job.ranks[1].exit) is False and job.ranks[0].exit.before(job.ranks[1].exit)
    assert (d.status, found) == ("crashed", [("rank_died", None, (0,))])
    (f,) = d.findings
    assert f.victim_ranks == (1,)
    assert "Rank 0 was killed by SIGKILL (the OOM killer" in f.detail
    assert f.basis == "`record` saw its process end first, by SIGKILL"
    assert "Rank 1 ended 33.0 ms later, by SIGTERM: the launcher stops the other workers" in f.detail
    assert f.evidence["exit"] == {"t_ns": t + 2_000_000, "signal": "SIGKILL", "status": None}
    assert f.evidence["killed_after"] == {"1": job.ranks[1].exit.aligned_ns}  # on the job's clock
    assert abs(job.ranks[1].exit.aligned_ns - (t + 35_000_000)) < 10_000


def test_a_killed_rank_whose_cpp_collectives_nothing_shows_is_still_the_first_failure(tmp_path):
    """Where a rank stopped among DDP's C++ collectives is unknown (gloo aborting it there, or the launcher killing
    it, would look alike in its log), but `record` saw SIGKILL end it: neither did; the SIGTERM after it did."""
    t = T0_NS + S
    d, found, _ = _ddp_deaths(tmp_path, [_exit(0, t, t + 2_000_000, "SIGKILL"),
                                         _exit(1, t + 3_000_000, t + 35_000_000, "SIGTERM")], cpp_calls=True)
    assert (d.status, found, d.findings[0].victim_ranks) == ("crashed", [("rank_died", None, (0,))], (1,))
    d, found, _ = _ddp_deaths(tmp_path / "aborted", [_exit(0, t, t + 2_000_000, "SIGABRT"),
                                                     _exit(1, t + 3_000_000, t + 35_000_000, "SIGTERM")],
                              cpp_calls=True)
    assert d.to_json()["suspect_ranks"] == [0] and d.to_json()["culprit_ranks"] == []  # gloo's abort: unknown


def test_deaths_record_saw_at_one_look_are_not_ordered(tmp_path):
    """Both ends seen in one pass (neither was seen alive after the other ended): which came first is unknown."""
    t = T0_NS + S
    d, found, _ = _ddp_deaths(tmp_path, [_exit(0, t, t + 2_000_000, "SIGKILL"), _exit(1, t, t + 2_000_000, "SIGKILL")])
    assert d.status == "crashed" and [c for _, _, c in found] == [(), ()]
    assert d.to_json()["suspect_ranks"] == [0, 1]


def test_ranks_all_ended_by_sigterm_are_not_ordered_into_a_culprit(tmp_path):
    """torchrun, itself sent SIGTERM (not through `record`), stops its workers one by one and exits 1: their order
    is the launcher's, not a failure's."""
    t = T0_NS + S
    d, found, _ = _ddp_deaths(tmp_path, [_exit(0, t, t + 2_000_000, "SIGTERM"),
                                         _exit(1, t + 3_000_000, t + 5_000_000, "SIGTERM")])
    assert d.status == "crashed" and [c for _, _, c in found] == [(), ()]
    assert d.to_json()["suspect_ranks"] == [0, 1]
    assert all(f.basis.startswith("ranks 0, 1 were all ended by SIGTERM, within 3") for f in d.findings)


def test_a_rank_whose_last_record_came_just_before_the_interruption_died_of_it(tmp_path):
    """`record` forwarded SIGTERM 1.5 ms after rank 0's last record; the process ended 61 ms after the signal, as
    `record` saw: the interruption ended it, not a death of its own (the log alone would say "before")."""
    logs = _logs(world=2)
    t = T0_NS + S
    logs[0].step(5, t)  # its last record
    logs[1].step(5, t + 5_000_000)  # after the signal: the interruption's
    signal_ns = t + 1_500_000
    exits = [_exit(0, t - S, t + 63_000_000, "SIGTERM"), _exit(1, t - S, t + 63_000_000, "SIGTERM")]
    d, found, _ = _verdict(tmp_path, logs, crashed={0, 1}, jobs=[{
        "host": "node01", "ended_ns": t + S, "exit_status": 143, "signal": "SIGTERM", "signal_ns": signal_ns,
        "exits": exits}])
    assert d.status != "crashed" and not d.to_json()["culprit_ranks"], found


def test_a_later_end_record_saw_without_its_cause_is_a_suspect(tmp_path):
    """Rank 1 ended after rank 0, but the launcher reaped it before `record` read how: stopped by the launcher,
    or a fault of its own, is not known."""
    t = T0_NS + S
    d, found, _ = _ddp_deaths(tmp_path, [_exit(0, t, t + 2_000_000, "SIGKILL"),
                                         _exit(1, t + 3_000_000, t + 35_000_000)])
    assert d.status == "crashed" and sorted(c for _, _, c in found) == [(), (0,)]
    later = next(f for f in d.findings if f.suspect_ranks == (1,))
    assert later.basis.startswith("it died 33.0 ms after rank 0's failure, outside any call")


def test_two_ranks_that_raised_their_own_exceptions_stay_culprits_whatever_order_their_exits_came_in(tmp_path):
    """Ranks 1 and 3 raise 1 ms apart; their processes end 59 ms apart (Python's teardown): an exception's time is
    exact, and the later exit makes no suspect of a rank that failed by itself."""
    logs = _logs(world=4)
    t = T0_NS + S
    for r in (1, 3):
        logs[r].ending(t + (3 - r) * 1_000_000, "exception", f"RuntimeError: injected fault on rank {r}")
    for r in (0, 2):
        logs[r].call("all_reduce", t, seq=6, shapes=[[4]], dtypes=["Float"], error=RESET, dur_ns=S // 10)
        logs[r].ending(t + S // 10, "exception", RESET)
        logs[r].close(t + S // 5)
    exits = [_exit(3, t, t + 10_000_000, status=1), _exit(1, t + 11_000_000, t + 69_000_000, status=1)]
    d, found, _ = _verdict(tmp_path, logs, crashed={1, 3},
                           jobs=[{"host": "node01", "ended_ns": t + S, "exit_status": 1, "exits": exits}])
    assert d.status == "crashed" and sorted(c for _, _, c in found) == [(1,), (3,)]


def test_a_rank_killed_inside_a_collective_every_rank_joined_is_the_culprit(tmp_path):
    """As in the suspect case above, but `record` saw SIGKILL end it: no abort of gloo's (SIGABRT) did."""
    t = T0_NS + S
    d, found, _ = _died_inside(tmp_path, {0: [[4]], 1: [[4]], 2: [[4]]}, [_exit(2, t, t + 5000, "SIGKILL")])
    assert (d.status, found) == ("crashed", [("rank_died", 6, (2,))])
    assert d.findings[0].victim_ranks == (0, 1)


@pytest.mark.parametrize("entry", [
    dict(alive_ns=T0_NS + 2 * S),  # seen alive after it was seen ended
    dict(signal="SIGKILL; rm -rf"), dict(signal="SIGKILL", status=0), dict(status=300), dict(pid=4242),
    dict(t_ns=-1), dict(rank="0"), dict(attempt=1),
])
def test_an_exit_entry_that_breaks_a_rule_is_left_out(tmp_path, entry):
    """A rank's exit counts only when every field is what `record` writes, and its pid is the log's."""
    good = _exit(0, T0_NS, T0_NS + S, "SIGKILL")
    d, _, job = _ddp_deaths(tmp_path, [{**good, **entry}, _exit(1, T0_NS, T0_NS + S, "SIGKILL")])
    assert job.ranks[0].exit is None and job.ranks[1].exit is not None
    assert d.to_json()["suspect_ranks"] == [0, 1]  # the logs alone cannot order these deaths


def test_a_pipeline_s_waits_on_ranks_a_death_took_down_are_the_death_s_story(tmp_path):
    """0 -> 1 -> 2: rank 1 is killed; rank 0's send to it fails, rank 2's receive from it fails (both lost their
    connection): one rank_died, no p2p desync, no other culprit."""
    logs = _logs(world=3, steps=2)
    t = T0_NS + S
    logs[1].heartbeats(t - S // 2)
    logs[0].call("send", t, peer=1, shapes=[[4]], dtypes=["Float"], error=RESET)
    logs[2].call("recv", t, peer=1, shapes=[[4]], dtypes=["Float"], error=RESET)
    for r in (0, 2):
        logs[r].ending(t + 1000, "exception", RESET)
        logs[r].close(t + 2000)
    d, found, _ = _verdict(tmp_path, logs, crashed={1},
                           jobs=[{"host": "node01", "ended_ns": t + S, "exit_status": 1}])
    assert (d.status, found) == ("crashed", [("rank_died", None, (1,))])


@pytest.mark.parametrize("gap_s, killed", [(0.3, True), (-0.2, False)])
def test_a_timeout_before_a_dead_rank_s_last_record_is_the_first_failure(monkeypatch, gap_s, killed):
    """The mesh of the fault matrix, once: ranks 1 and 3 raised gloo's timeout, then torchrun killed rank 0,
    which was waiting inside a call; its last heartbeat came 0.3 s after the timeouts, so it was alive when they
    failed and their failure did not follow from its death: it is the launcher's victim, not a culprit. A timeout
    after a dead rank's last record may be that death's doing: then the rank died first."""
    from comm2perfetto.diagnose import weigh
    from comm2perfetto.diagnose.endings import RankEnd

    monkeypatch.setattr(weigh, "launcher_failed", lambda job: True)
    monkeypatch.setattr(weigh, "_inside_a_call", lambda job, r: True)
    monkeypatch.setattr(weigh, "died_inside", lambda job, r: None)
    monkeypatch.setattr(weigh, "calls_unseen", lambda job, r: False)
    t = T0_NS + 10 * S
    timeout = "RuntimeError: Timed out waiting 8000ms for recv operation to complete"
    ends = {0: RankEnd(0, DIED, t + int(gap_s * S), "its process is gone"),
            1: RankEnd(1, PEER_LOST, t, timeout), 3: RankEnd(3, PEER_LOST, t + 5_000_000, timeout)}
    dead = {0: ends[0]}
    assert set(weigh.teardown(object(), ends, dead)) == ({0} if killed else set())
    assert set(dead) == (set() if killed else {0})
