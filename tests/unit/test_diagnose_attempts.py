"""A job torchrun restarted: each attempt's files in a folder of their own (attempt k >= 1 in ``attempt<k>``),
read one attempt at a time, the last by default, with a word on how the others ended. Built logs; the real
restarts are in tests/integration/test_restarts.py."""

from __future__ import annotations

import io
import json
from pathlib import Path

import orjson
import pytest

from comm2perfetto import layout
from comm2perfetto.diagnose.attempts import attempt_end, attempts_text
from comm2perfetto.diagnose.diagnosis import diagnose
from comm2perfetto.diagnose.findings import AttemptEnd
from comm2perfetto.load_options import LoadOptions
from comm2perfetto.match import load_job
from comm2perfetto.sources.discover import SourceError
from comm2perfetto.sources.read import load_sources
from comm2perfetto.stall_watch import StallWatcher
from support.cli import run_cli
from support.factories import T0_NS, EventLog

S = 10**9
RESET = "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:6306"


def _attempt(folder: Path, t0: int, raises: int | None = None, at_step: int = 3, steps: int = 5) -> None:
    """A 2-rank attempt of all_reduces from ``t0``; ``raises``: that rank raises before all_reduce ``at_step``
    and the other fails in it (what gloo does when its peer's process is gone)."""
    for r in range(2):
        log = EventLog(rank=r, world=2)
        log.group(0, "0", "default_pg", [0, 1])
        last = steps if raises is None else at_step
        for i in range(last):
            log.call("all_reduce", t0 + i * S // 10 + r * 1000, seq=i + 1, shapes=[[4]], dtypes=["Float"])
        end = t0 + last * S // 10
        if raises is None:
            log.close(end + S // 10)
        elif r == raises:
            log.ending(end, "exception", f"RuntimeError: attempt fails on rank {r}")
        else:
            log.call("all_reduce", end + 1000, seq=last + 1, shapes=[[4]], dtypes=["Float"], error=RESET)
            log.ending(end + 2000, "exception", RESET)
        log.write(folder, crashed=raises is not None)


def _restarted(tmp_path: Path, last_fails: bool = False) -> Path:
    """``out``: attempt 0 (rank 1 raised), attempt 1 in ``out/attempt1`` (healthy, or rank 0 raised), and the job
    file `record` wrote at the end (the launcher's exit status is the last attempt's)."""
    out = tmp_path / "out"
    _attempt(out, T0_NS, raises=1)
    _attempt(out / "attempt1", T0_NS + 5 * S, raises=0 if last_fails else None, at_step=1)
    (out / "job.node01.99.json").write_text(json.dumps({
        "format": "comm2perfetto-job", "host": "node01", "ended_ns": T0_NS + 8 * S,
        "exit_status": 1 if last_fails else 0, "signal": None}))
    return out


def _verdict(job) -> tuple:
    d = diagnose(job)
    return d.status, [(f.kind, f.seq, f.culprit_ranks) for f in d.findings]


def test_the_last_attempt_is_read_by_default_and_any_other_on_request(tmp_path):
    out = _restarted(tmp_path)
    last = load_job([out])
    assert (last.attempt, last.attempts) == (1, (0, 1))
    assert all("attempt1" in str(log.path) for log in last.logs.values())
    assert _verdict(last) == ("ok", [])
    first = load_job([out], LoadOptions(attempt=0))
    assert (first.attempt, first.attempts) == (0, (0, 1))
    assert all(Path(str(log.path)).parent == out for log in first.logs.values())
    assert _verdict(first) == ("crashed", [("rank_died", 4, (1,))])


def test_the_run_end_of_the_job_file_is_the_last_attempts_only(tmp_path):
    out = _restarted(tmp_path, last_fails=True)
    (last_job,) = load_job([out]).jobs
    assert last_job["exit_status"] == 1
    (first_job,) = load_job([out], LoadOptions(attempt=0)).jobs
    assert "exit_status" not in first_job and "signal" not in first_job and first_job["ended_ns"]
    assert not any("exited with status" in n for n in diagnose(load_job([out], LoadOptions(attempt=0))).notes)


def test_a_folder_from_before_attempts_is_one_attempt(tmp_path):
    _attempt(tmp_path / "out", T0_NS)
    job = load_job([tmp_path / "out"])
    assert (job.attempt, job.attempts) == (0, (0,))


def test_attempt_folders_count_below_the_path_given_only(tmp_path):
    """A recording folder its user named ``attempt3`` is no attempt; an attempt folder of a node's folder is."""
    out = tmp_path / "attempt3"
    _attempt(out, T0_NS, raises=1)
    _attempt(out / "node1" / "attempt2", T0_NS + 5 * S)
    src = load_sources([out])
    assert (src.attempt, src.attempts) == (2, (0, 2))


def test_an_attempt_that_is_not_there_is_one_clear_message(tmp_path):
    out = _restarted(tmp_path)
    with pytest.raises(SourceError, match=r"--attempt 2: .* holds no files of attempt 2 \(attempts found: 0, 1;"):
        load_sources([out], LoadOptions(attempt=2))


def test_files_skipped_belong_to_their_attempt(tmp_path):
    out = _restarted(tmp_path)
    (out / "attempt1" / "rank1.fr.1.pkl").write_bytes(b"\x80\x04garbage")  # a dump, unreadable
    (out / "attempt1" / "notes.txt").write_text("not a recording's file")  # not even that
    assert sorted(Path(s.path).name for s in load_sources([out]).skipped) == ["notes.txt", "rank1.fr.1.pkl"]
    assert load_sources([out], LoadOptions(attempt=0)).skipped == []


def test_diagnose_says_which_attempt_and_how_the_others_ended(tmp_path):
    out = _restarted(tmp_path)
    code, text, _ = run_cli("diagnose", str(out))
    assert code == 0 and text.startswith("OK:")
    assert ("torchrun restarted the job: this verdict is about attempt 1, the last of attempts 0, 1. Attempt 0: "
            "crashed, rank 1 raised RuntimeError: attempt fails on rank 1 (`--attempt 0` for its verdict).") \
        in " ".join(text.split())
    code, text, _ = run_cli("diagnose", str(out), "--format", "json")
    doc = orjson.loads(text)
    assert doc["attempt"] == 1
    assert doc["other_attempts"] == [{"attempt": 0, "status": "crashed", "culprit_ranks": [1],
                                      "summary": "rank 1 raised RuntimeError: attempt fails on rank 1"}]
    code, text, _ = run_cli("diagnose", str(out), "--attempt", "0", "--format", "json")
    doc = orjson.loads(text)
    assert (code, doc["status"], doc["attempt"]) == (1, "crashed", 0)
    assert [f["culprit_ranks"] for f in doc["findings"]] == [[1]]
    assert doc["other_attempts"] == [{"attempt": 1, "status": "ok", "culprit_ranks": [],
                                      "summary": "every collective matched on all ranks"}]


def test_a_last_attempt_that_fails_early_is_the_verdict_the_earlier_crash_an_earlier_attempt(tmp_path):
    out = _restarted(tmp_path, last_fails=True)
    code, text, _ = run_cli("diagnose", str(out), "--format", "json")
    doc = orjson.loads(text)
    assert (code, doc["status"], doc["attempt"]) == (1, "crashed", 1)
    assert [(f["kind"], f["seq"], f["culprit_ranks"]) for f in doc["findings"]] == [("rank_died", 2, [0])]
    assert [(a["attempt"], a["status"], a["culprit_ranks"]) for a in doc["other_attempts"]] == [(0, "crashed", [1])]


def test_a_job_never_restarted_says_nothing_of_attempts(tmp_path):
    _attempt(tmp_path / "out", T0_NS)
    code, text, _ = run_cli("diagnose", str(tmp_path / "out"), "--format", "json")
    doc = orjson.loads(text)
    assert (code, doc["attempt"], doc["other_attempts"]) == (0, None, [])
    code, text, _ = run_cli("diagnose", str(tmp_path / "out"))
    assert "attempt" not in text


@pytest.mark.parametrize("bad", ["-1", "one"])
def test_a_bad_attempt_number_is_a_usage_error(tmp_path, bad):
    code, _, err = run_cli("diagnose", str(_restarted(tmp_path)), "--attempt", bad)
    assert code == 2 and "is not an attempt number" in err


def test_merge_and_report_say_it_too(tmp_path):
    out = _restarted(tmp_path)
    code, text, _ = run_cli("merge", str(out), "-o", str(tmp_path / "job.pftrace"))
    assert code == 0
    assert "  attempts: torchrun restarted the job: this trace is about attempt 1, the last of attempts 0, 1. " \
           "Attempt 0: crashed, rank 1 raised" in text
    code, text, _ = run_cli("report", str(out), "--attempt", "0", "--format", "json")
    notes = orjson.loads(text)["notes"]
    assert code == 0 and notes[0].startswith("torchrun restarted the job: this report is about attempt 0, "
                                             "not the last of attempts 0, 1. Attempt 1: ok, ")


def test_the_words_for_each_case():
    crashed = AttemptEnd(0, "crashed", (1,), "rank 1 raised ValueError: bad")
    assert attempts_text(None, ()) is None
    assert attempts_text(0, ()) is None
    assert attempts_text(2, ()) == ("torchrun restarted the job: this verdict is about attempt 2, the last of "
                                    "attempts 2. No earlier attempt left files here.")
    assert attempts_text(1, [crashed, AttemptEnd(2, None, (), "not read: no files")]) == (
        "torchrun restarted the job: this verdict is about attempt 1, not the last of attempts 0, 1, 2. "
        "Attempt 0: crashed, rank 1 raised ValueError: bad (`--attempt 0` for its verdict). "
        "Attempt 2: not read: no files (`--attempt 2` for its verdict).")


def test_an_attempts_ending_comes_from_its_first_finding(tmp_path):
    _attempt(tmp_path / "out", T0_NS, raises=1)
    end = attempt_end(3, diagnose(load_job([tmp_path / "out"])))
    assert end == AttemptEnd(3, "crashed", (1,), "rank 1 raised RuntimeError: attempt fails on rank 1")


# --- the launcher side: overwrite and the live verdict follow the attempts ---------------------------------


def test_overwrite_replaces_every_attempts_files(tmp_path):
    from comm2perfetto.cli.record import _existing_recording

    out = _restarted(tmp_path)
    found = {Path(p).relative_to(out).as_posix() for p in _existing_recording(str(out))}
    assert {"rank0.events.jsonl", "attempt1/rank1.events.jsonl", "job.node01.99.json"} <= found


def _snapshot(gen: int, culprit: int) -> dict:
    def rank(r: int, issued: int) -> dict:
        pending = {"op": "all_reduce", "seq": 4, "since_ns": T0_NS, "source": "patch"} if issued == 4 else None
        return {"rank": r, "host": "node0", "pid": 100 + r, "t_ns": T0_NS + S, "step": 3, "stack": [],
                "groups": {"0": {"desc": "default_pg", "ranks": [0, 1], "issued": issued, "pending": pending}}}
    return {"format": "comm2perfetto-live", "version": 1, "gen": gen, "world_size": 2, "gathered_ns": T0_NS,
            "gathered_by": 0, "ranks": [rank(r, 3 if r == culprit else 4) for r in (0, 1)]}


def test_the_live_verdict_follows_the_latest_attempt(tmp_path):
    """Each attempt numbers its stalls from 1 in its own folder: a restart's stall 1 is a new stall."""
    err = io.StringIO()
    watcher = StallWatcher(str(tmp_path), None, err=err)
    for folder, culprit in ((tmp_path, 1), (tmp_path / "attempt1", 0)):
        path = Path(folder) / layout.live_snapshot(1)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(orjson.dumps(_snapshot(1, culprit)))
        watcher.poll()
    watcher.stop()
    text = err.getvalue()
    assert "live verdict at stall 1 (the job is still running)" in text
    assert "live verdict at stall 1 of attempt 1 (torchrun restarted the job)" in text
    assert text.index("culprit: 1") < text.index("culprit: 0")
    latest = orjson.loads((tmp_path / layout.STALL_VERDICT_FILE).read_bytes())
    assert (latest["gen"], latest["attempt"], latest["verdict"]["findings"][0]["culprit_ranks"]) == (1, 1, [0])
