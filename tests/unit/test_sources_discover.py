"""Finding a job's files by content, and refusing what cannot be used."""

from __future__ import annotations

import gzip
import json
import pickle

import pytest

from comm2perfetto.load_options import LoadOptions
from comm2perfetto.match import load_job
from comm2perfetto.sources.checks import MixedJobsError
from comm2perfetto.sources.discover import EVENT_LOG, FR, JOB, KINETO, STACKS, SourceError, discover
from comm2perfetto.sources.read import load_sources
from support.factories import T0_NS, EventLog, FrJob, stacks_file, steady_job


def _kineto_doc(rank: int) -> dict:
    return {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2},
            "baseTimeNanoseconds": T0_NS, "traceEvents": [
                {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0}]}


def test_files_are_recognised_by_content_not_name(tmp_path):
    job = steady_job(world=2, steps=2)
    names = {0: "weird-name.bin", 1: "rank1.fr.1.pkl"}
    job.write(tmp_path / "a" / "deep", names=names)
    (tmp_path / "fr.json").write_text(json.dumps(job.document(0, fmt="json")))
    log = EventLog(rank=0, world=2)
    log.write(tmp_path)
    stacks_file(tmp_path, 0, [("data.py", 88, "next_batch")], T0_NS)
    (tmp_path / "trace.json.gz").write_bytes(gzip.compress(json.dumps(_kineto_doc(0)).encode()))
    (tmp_path / "profile.json").write_text(json.dumps(_kineto_doc(1)))
    (tmp_path / "job.json").write_text(json.dumps({"format": "comm2perfetto-job", "exit_status": 0}))
    (tmp_path / "notes.txt").write_text("torchrun output\n")
    (tmp_path / "empty").write_bytes(b"")
    found, skipped = discover([tmp_path])
    kinds = {f.path.name: f.kind for f in found}
    assert kinds == {"weird-name.bin": FR, "rank1.fr.1.pkl": FR, "fr.json": FR, "rank0.events.jsonl": EVENT_LOG,
                     "rank0.stacks.1.json": STACKS, "trace.json.gz": KINETO, "profile.json": KINETO,
                     "job.json": JOB}
    assert {s.path.rsplit("/", 1)[1]: s.reason for s in skipped} == {
        "notes.txt": "unknown format (not a dump, log, stacks or trace file)", "empty": "empty file"}


def test_kineto_rank_is_read_from_its_content(tmp_path):
    (tmp_path / "a.json.gz").write_bytes(gzip.compress(json.dumps(_kineto_doc(1)).encode()))
    steady_job(world=2, steps=1).write(tmp_path)
    src = load_sources([tmp_path])
    assert [p.name for p in src.kineto[1]] == ["a.json.gz"]


def test_several_folders_are_read_together(tmp_path):
    job = steady_job(world=4, steps=3)
    job.write(tmp_path / "host0", ranks=[0, 1])
    job.write(tmp_path / "host1", ranks=[2, 3])
    loaded = load_job([tmp_path / "host0", tmp_path / "host1"])
    assert loaded.ranks_with_data == (0, 1, 2, 3)


def test_corrupt_and_unknown_files_are_skipped_with_their_names(tmp_path):
    job = steady_job(world=3, steps=2)
    job.write(tmp_path)
    data = (tmp_path / "nccl_trace_rank_2").read_bytes()
    (tmp_path / "nccl_trace_rank_2").write_bytes(data[:40])  # truncated
    (tmp_path / "nccl_trace_rank_9").write_bytes(pickle.dumps({"hello": 1}, protocol=2))  # a pickle, not a dump
    loaded = load_job([tmp_path])
    reasons = {s.path.rsplit("/", 1)[1]: s.reason for s in loaded.skipped}
    assert "truncated" in reasons["nccl_trace_rank_2"]
    assert "not a Flight Recorder dump" in reasons["nccl_trace_rank_9"]
    assert loaded.ranks_with_data == (0, 1)


def test_a_dump_without_a_rank_in_its_name_is_skipped_with_advice(tmp_path):
    steady_job(world=1, steps=1).write(tmp_path, names={0: "flight_recorder.pkl"})
    steady_job(world=1, steps=1).write(tmp_path / "ok")
    loaded = load_job([tmp_path])
    (skipped,) = loaded.skipped
    assert skipped.path.endswith("flight_recorder.pkl") and "rename" in skipped.reason


def test_a_folder_with_nothing_usable_is_an_error(tmp_path):
    (tmp_path / "readme.txt").write_text("nothing here")
    with pytest.raises(SourceError,
                       match=r"no Flight Recorder dump, comm2perfetto event log or profiler trace.*readme\.txt"):
        load_job([tmp_path])


def test_a_missing_path_is_an_error(tmp_path):
    with pytest.raises(SourceError, match="no such file or folder"):
        load_job([tmp_path / "nope"])


def test_dumps_of_different_world_sizes_are_refused_unless_forced(tmp_path):
    steady_job(world=2, steps=2).write(tmp_path, ranks=[0, 1])
    steady_job(world=4, steps=2).write(tmp_path / "other", ranks=[2, 3])
    with pytest.raises(MixedJobsError, match=r"disagree on the default group \(2 vs 4 ranks.*--force"):
        load_job([tmp_path])
    forced = load_job([tmp_path], LoadOptions(force=True))
    assert any("--force" in n for n in forced.notes)


def test_two_runs_dumping_the_same_rank_are_refused(tmp_path):
    steady_job(world=2, steps=2).write(tmp_path / "run1")
    other = steady_job(world=2, steps=2)
    for r in other.ranks:
        for e in other.entries[r]:
            e["time_created_ns"] += 10**12  # the same records, an hour later: another run
    other.write(tmp_path / "run2")
    with pytest.raises(MixedJobsError, match="disagree about record"):
        load_job([tmp_path])


def test_event_logs_of_different_runs_are_refused(tmp_path):
    a, b = EventLog(rank=0, world=2), EventLog(rank=1, world=2)
    b.lines[0]["run_id"] = "run-2"
    a.write(tmp_path)
    b.write(tmp_path)
    with pytest.raises(MixedJobsError, match="different runs"):
        load_job([tmp_path])


def test_gloo_dumps_whose_pg_config_does_not_name_their_groups_load(tmp_path):
    job = FrJob(world=2, backend="gloo")  # pg_config {"": {"name": "", "ranks": "[]"}} as gloo writes it
    for r in job.ranks:
        job.collective(r, "all_reduce", [[4]], state="scheduled")
    job.write(tmp_path)
    loaded = load_job([tmp_path])
    (group,) = loaded.groups.values()
    assert (group.name, group.desc, group.ranks, group.ranks_source) == ("0", "default_pg", (0, 1), "world")
    assert loaded.world_size == 2


def test_gzipped_dumps_are_read(tmp_path):
    job = steady_job(world=2, steps=3)
    job.write(tmp_path / "raw")
    for path in (tmp_path / "raw").iterdir():
        (tmp_path / f"{path.name}.pkl.gz").write_bytes(gzip.compress(path.read_bytes()))
    (tmp_path / "raw" / "nccl_trace_rank_0").unlink()
    (tmp_path / "raw" / "nccl_trace_rank_1").unlink()
    loaded = load_job([tmp_path])
    assert loaded.ranks_with_data == (0, 1) and len(loaded.collectives["0[0,1]"]) == 3


def test_profiler_trace_with_pg_config_is_not_taken_for_a_dump(tmp_path):
    """torch.profiler writes distributedInfo.pg_config near the top, a key Flight Recorder JSON has too."""
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": 1, "world_size": 2,
                                                    "pg_config": [{"pg_name": "0", "ranks": [0, 1]}]},
           "baseTimeNanoseconds": 1_795_000_000_000_000_000, "traceEvents": []}
    path = tmp_path / "rank1.kineto.1.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    (found,), skipped = discover([tmp_path])
    assert (found.kind, skipped) == ("kineto", [])
