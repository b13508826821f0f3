"""Hostile and malformed input, one case per kind, through the CLI (issue 13's table).

Every case starts from the real recording in tests/data/recording and runs diagnose, merge and report in a
child process under an address-space limit and a time limit (``hostile.run_bounded``): each ends with 0, 1 or 2,
prints no traceback, names what it skipped in one line, and never mistakes a file's claim for data.
"""

from __future__ import annotations

import gzip
import math
import os
import shutil
import signal
import time
import zlib
from pathlib import Path

import orjson
import pytest

from comm2perfetto.sources.limits import MAX_FILE_BYTES, MAX_WORLD_SIZE, TooLargeError, gunzip_bounded, read_bounded
from support.cli import run_cli
from support.hostile import (
    CliRun,
    copy_recording,
    edit_entries,
    garbage_after_header,
    gzip_bomb,
    huge_pg_config,
    run_bounded,
    set_header,
    warm_up,
)
from support.verdicts import verdict

COMMANDS = ("diagnose", "merge", "report")


@pytest.fixture(scope="module", autouse=True)
def _warm(tmp_path_factory: pytest.TempPathFactory) -> None:
    from support.hostile import RECORDING

    warm_up(RECORDING, tmp_path_factory.mktemp("warm") / "job.pftrace")


@pytest.fixture
def rec(tmp_path: Path) -> Path:
    return copy_recording(tmp_path / "rec")


def _run_all(folder: Path, **kwargs) -> dict[str, CliRun]:
    out = folder.parent / "job.pftrace"
    runs = {
        "diagnose": run_bounded(["diagnose", str(folder)], **kwargs),
        "merge": run_bounded(["merge", str(folder), "-o", str(out)], **kwargs),
        "report": run_bounded(["report", str(folder)], **kwargs),
    }
    for name, run in runs.items():
        assert run.rc in (0, 1, 2) and not run.traceback, run.explain()
        assert not list(folder.parent.glob(".*.partial")), name
    return runs


def test_a_world_size_of_a_billion_in_a_header_skips_that_log_without_allocating_it(rec):
    for path in rec.glob("*.events.jsonl"):
        set_header(path, world_size=1_000_000_000)
    runs = _run_all(rec)
    assert "header's world_size 1000000000 is not a number of ranks from 1 to 131,072" in runs["diagnose"].out
    assert runs["diagnose"].peak_rss_bytes < 1 << 30


def test_a_dump_named_for_rank_99999999999_is_skipped_and_named(rec):
    shutil.copy(rec / "rank0.fr.2.pkl", rec / "rank99999999999.fr.1.pkl")
    runs = _run_all(rec)
    assert "rank99999999999.fr.1.pkl: rank 99999999999 (from the file name) is beyond the largest world size" \
        in runs["diagnose"].out
    assert "data from ranks 0-3)" in runs["diagnose"].out
    assert runs["merge"].rc == 0 and "ranks: 4 of 4" in runs["merge"].out


def test_stall_stacks_of_a_rank_outside_the_world_are_not_taken_as_a_rank(rec):
    doc = orjson.loads((rec / "rank0.stacks.1.json").read_bytes())
    (rec / "rank99.stacks.1.json").write_bytes(orjson.dumps(dict(doc, rank=99)))
    out = _run_all(rec)["diagnose"].out
    assert "(world size 4, data from ranks 0-3)" in out
    assert "rank99.stacks.1.json: stall stacks of rank 99, outside the job's 4 ranks" in out


def test_a_group_listing_more_ranks_than_accepted_is_not_taken_from_the_dumps(rec):
    for path in rec.glob("*.events.jsonl"):
        path.unlink()  # the dumps alone, as torch leaves them
    huge_pg_config(rec, MAX_WORLD_SIZE + 1)
    runs = _run_all(rec)
    assert "group '0' lists its ranks as something other than up to 131,072 distinct ranks" in runs["diagnose"].out
    assert all(run.secs < 30 for run in runs.values())  # bounded, not a benchmark: 0.5 s here


def test_a_gzip_bomb_is_refused_with_one_line(rec):
    gzip_bomb(rec / "rank0.fr.9.pkl.gz", MAX_FILE_BYTES + 1)
    run = run_bounded(["diagnose", str(rec)])
    assert run.rc == 1 and not run.traceback, run.explain()
    assert "rank0.fr.9.pkl.gz: inflates to more than 536,870,912 bytes, larger than any real one; not read" in run.out


@pytest.mark.parametrize("fields", [
    {"collective_seq_id": 1.5}, {"time_created_ns": "yesterday"}, {"time_discovered_completed_ns": "x"},
    {"time_created_ns": math.nan}, {"time_created_ns": math.inf}, {"time_created_ns": -5},
    {"time_created_ns": 10**100}, {"process_group": 7}, {"profiling_name": None},
])
def test_fields_with_a_wrong_type_or_an_absurd_value_are_skipped_and_named(rec, fields):
    edit_entries(rec, 1, **fields)
    out = _run_all(rec)["diagnose"].out
    (field, _), = fields.items()
    identity = field in ("collective_seq_id", "process_group", "profiling_name")
    assert ("identity unreadable" if identity else "failed their check") in out, out
    assert f"{field} of record 0 " in out or f"): {field} is " in out or f"a record: {field} is " in out, out


def test_dtypes_that_are_not_names_make_an_unknown_signature_not_a_crash(rec):
    """Entries whose dtypes are not names and output sizes not numbers are kept, those fields unknown and named:
    no entry is skipped, and an unknown signature is compared with no rank's, so the verdict is the recording's."""
    before = verdict(run_cli("diagnose", rec, "--format", "json").json())
    edit_entries(rec, 1, input_dtypes=[5], output_sizes=[["a"]])
    out = _run_all(rec)["diagnose"].out
    assert "input_dtypes of record 0 (barrier #1 on default_pg) is [5], not a list of dtypes" in out
    assert "entry skipped" not in out and "entries skipped" not in out, out
    assert verdict(run_cli("diagnose", rec, "--format", "json").json()) == before


def test_a_header_rank_that_is_not_a_number_skips_that_log(rec):
    set_header(rec / "rank0.events.jsonl", rank="zero")
    out = _run_all(rec)["diagnose"].out
    assert "rank0.events.jsonl: header's rank 'zero' is not a rank of its 4-rank job" in out


def test_a_fifo_among_the_dumps_is_not_opened(rec):
    os.mkfifo(rec / "rank0.fr.9.pkl")
    runs = _run_all(rec, timeout=60)
    assert "rank0.fr.9.pkl: not a regular file (a FIFO); not read" in runs["diagnose"].out


def test_an_event_log_of_garbage_lines_gives_one_note(rec):
    garbage_after_header(rec / "rank0.events.jsonl", 100_000)
    runs = _run_all(rec)
    assert "rank0.events.jsonl: 100,000 bad lines skipped (first at line 2: not a record)" in runs["diagnose"].out
    assert runs["diagnose"].out.count("\n") < 40 and runs["report"].out.count("\n") < 80


def test_an_interrupted_merge_leaves_no_partial_file(rec, monkeypatch):
    import comm2perfetto.trace.write as write

    real = write.write_timeline

    def killed_halfway(*args, **kwargs):
        real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # a scheduler's kill while the trace is being written
        time.sleep(30)

    monkeypatch.setattr(write, "write_timeline", killed_halfway)
    run = run_bounded(["merge", str(rec), "-o", str(rec.parent / "job.pftrace")])
    assert run.rc == 130 and not run.traceback, run.explain()
    assert not list(rec.parent.glob(".*.partial")) and not (rec.parent / "job.pftrace").exists()


def test_a_crashed_merge_leaves_no_partial_file_and_says_internal_error(rec, monkeypatch):
    import comm2perfetto.trace.write as write

    def crash(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(write, "write_timeline", crash)
    run = run_bounded(["merge", str(rec), "-o", str(rec.parent / "job.pftrace")])
    assert run.rc == 3 and not run.traceback, run.explain()
    assert run.err.splitlines()[-1].startswith("comm2perfetto merge: internal error (RuntimeError: a bug at ")
    assert "this is a bug: please report it" in run.err
    assert not list(rec.parent.glob(".*.partial"))


def test_a_partial_file_of_a_killed_merge_is_removed_by_the_next_one(rec):
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)  # a pid that no longer runs: its merge was SIGKILLed
    stale = rec.parent / f".job.pftrace.{dead}.partial"
    stale.write_bytes(b"half a trace")
    mine = rec.parent / f".job.pftrace.{os.getpid()}.partial"  # a merge still running: left alone
    mine.write_bytes(b"in progress")
    run = run_bounded(["merge", str(rec), "-o", str(rec.parent / "job.pftrace")])
    assert run.rc == 0, run.explain()
    assert not stale.exists() and mine.exists()


def test_a_rank_outside_the_world_the_profiler_traces_state_is_skipped(rec):
    """With only dumps and profiler traces, the traces' distributedInfo states the world: a dump named for rank
    131071 of this 4-rank job is skipped and named, not drawn as a 131,072-rank job."""
    for path in [*rec.glob("*.events.jsonl"), *rec.glob("*.stacks.*.json")]:
        path.unlink()
    shutil.copy(rec / "rank0.fr.2.pkl", rec / f"rank{MAX_WORLD_SIZE - 1}.fr.1.pkl")
    run = run_bounded(["diagnose", str(rec)])
    assert "data from ranks 0-3)" in run.out, run.explain()
    assert f"rank{MAX_WORLD_SIZE - 1}.fr.1.pkl: Flight Recorder dump of (by its name) rank {MAX_WORLD_SIZE - 1}, " \
        "outside the job's 4 ranks" in run.out


def test_an_input_error_is_one_line_and_status_2_in_a_fresh_interpreter(rec):
    (rec / "rank0.events.jsonl").write_bytes(b"")  # an input error: exit 2 in one line, not 3
    for path in [*rec.glob("*.pkl"), *rec.glob("*.kineto.*")]:  # profiler traces alone would be a job
        path.unlink()
    for path in rec.glob("rank[123].events.jsonl"):
        path.unlink()
    run = run_bounded(["diagnose", str(rec)], fresh=True)
    assert run.rc == 2 and run.err.count("\n") == 1 and not run.traceback, run.explain()


# --- the bounded reader itself ----------------------------------------------------------------------------


def test_gunzip_bounded_reads_several_members_and_refuses_beyond_the_limit(tmp_path):
    data = gzip.compress(b"a" * 1000) + gzip.compress(b"b" * 1000)
    assert gunzip_bounded(data, 2000) == b"a" * 1000 + b"b" * 1000
    with pytest.raises(TooLargeError):
        gunzip_bounded(data, 1999)
    with pytest.raises(EOFError):
        gunzip_bounded(gzip.compress(b"a" * 1000)[:-12], 2000)
    with pytest.raises(zlib.error):
        gunzip_bounded(b"\x1f\x8b" + b"garbage" * 10, 2000)


def test_read_bounded_refuses_a_file_larger_than_the_limit(tmp_path):
    path = tmp_path / "big"
    path.write_bytes(b"x" * 101)
    assert read_bounded(path, 101) == b"x" * 101
    with pytest.raises(TooLargeError):
        read_bounded(path, 100)


def test_a_dump_named_for_the_largest_rank_accepted_costs_time_for_the_data_not_the_world(rec):
    """Dumps alone (no header or profiler trace states the world): rank 131071's dump makes a 131,072-rank world
    of which 131,067 ranks left nothing. The trace shows the ranks with data first and a sample, not 131,072
    tracks."""
    for path in [*rec.glob("*.events.jsonl"), *rec.glob("*.stacks.*.json"), *rec.glob("*.kineto.*")]:
        path.unlink()
    shutil.copy(rec / "rank0.fr.2.pkl", rec / f"rank{MAX_WORLD_SIZE - 1}.fr.1.pkl")
    runs = _run_all(rec)
    assert f"showing 256 of {MAX_WORLD_SIZE} ranks" in runs["merge"].out
    assert "(world size 131072, data from ranks 0-3, 131071)" in runs["diagnose"].out
    assert "suspect: 4-131070 (no data from them)" in runs["diagnose"].out
    assert all(run.secs < 60 for run in runs.values())  # bounded, not a benchmark: about a second each
