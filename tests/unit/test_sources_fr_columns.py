"""Compact per-rank columns (issue 23): what a track holds, the collective views over them, and the compact form
on disk (``comm2perfetto compact``) read back as input."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import orjson
import pytest

from comm2perfetto.group_columns import GroupCollectives
from comm2perfetto.match import load_job
from comm2perfetto.model import COMPLETED, STARTED
from comm2perfetto.sources.fr.compact import MAGIC, file_name
from comm2perfetto.sources.fr.dump import read_fr_dump
from comm2perfetto.sources.fr.ingest import build_rank_trace
from comm2perfetto.sources.fr.tables import SignatureTable, StackTable
from support.cli import run_cli
from support.factories import FrJob, steady_job
from support.hostile import RECORDING, copy_recording


def _write(job: FrJob, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for r in job.ranks:
        (folder / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(job.document(r), protocol=2))
    return folder


def test_a_track_holds_under_sixty_bytes_an_entry_whatever_its_frames():
    job = steady_job(world=2, steps=500)
    dump = read_fr_dump("nccl_trace_rank_0", pickle.dumps(job.document(0), protocol=2))
    trace, _ = build_rank_trace(0, [dump], StackTable(), SignatureTable())
    (track,) = trace.groups.values()
    assert len(track) == len(dump.entries)
    assert track.held_bytes() / len(track) <= 60
    assert track.states == [COMPLETED] * len(track)  # decoded views give the model's values
    assert all(s is track.sig_table[0] or s in track.sig_table for s in track.sigs)


def test_views_gather_the_same_values_as_each_ranks_column(tmp_path):
    job = FrJob(world=3)
    for r in range(3):
        for _ in range(4):
            job.collective(r, "all_reduce", [[4]])
    job.collective(0, "all_reduce", [[4]], state=STARTED)  # ranks 1 and 2 never issued #5
    job.collective(1, "all_reduce", [[4]], state=STARTED)
    loaded = load_job([_write(job, tmp_path)])
    (cols,) = loaded.collectives.values()
    assert isinstance(cols, GroupCollectives) and [c.seq for c in cols] == [1, 2, 3, 4, 5]
    last = cols[-1]
    assert last.joined_ranks == (0, 1) and last.states == (STARTED, STARTED, None)
    assert cols.find(5) is last  # a view stays the same object while held
    for rank in range(3):
        column = cols.member_column("arrive_ns", rank)
        assert column == [c.arrive_ns[c.index_of(rank)] for c in cols]
    assert cols.settled_prefix() == 4  # the first four: every rank, one signature, all completed


def test_a_small_group_builds_a_fields_tuples_at_once_only_for_a_pass(tmp_path, monkeypatch):
    """Diagnose reads a few collectives of a group (its culprit's); report and merge read them all. A small
    group gathers a field for the few, and builds every tuple of it in one zip once a pass reads it."""
    job = steady_job(4, 40)
    folder = tmp_path / "dumps"
    job.write(folder)
    (cols,) = load_job([folder]).collectives.values()
    zips: list[str] = []
    member_column = GroupCollectives.member_column

    def counted(self, name, rank):
        zips.append(name)
        return member_column(self, name, rank)

    monkeypatch.setattr(GroupCollectives, "member_column", counted)
    few = [cols[i].arrive_ns for i in (3, 30)]
    assert zips == []  # gathered for those two alone
    every = [c.arrive_ns for c in cols]
    assert zips == ["arrive_ns"] * 4  # the pass: one zip over the four ranks' columns, once
    assert few == [every[3], every[30]] and every == [tuple(t) for t in zip(*(member_column(cols, "arrive_ns", r)
                                                                            for r in range(4)))]


def test_a_rank_whose_signature_differs_ends_the_settled_prefix(tmp_path):
    job = FrJob(world=2)
    for r in range(2):
        for i in range(5):
            job.collective(r, "all_reduce", [[8]] if (r, i) == (1, 2) else [[4]])
    (cols,) = load_job([_write(job, tmp_path)]).collectives.values()
    assert cols.settled_prefix() == 2
    assert cols[2].signatures[0] != cols[2].signatures[1]


def test_compact_then_diagnose_merge_report_give_what_the_dumps_give(tmp_path):
    rec = copy_recording(tmp_path / "rec")
    out = tmp_path / "compact"
    ran = run_cli("compact", str(rec), "-o", str(out))
    assert ran.code == 0
    assert "4 rank(s) of Flight Recorder columns" in ran.out
    assert sorted(p.name for p in out.glob("*.fr-columns")) == [file_name(r) for r in range(4)]
    a, b = run_cli("diagnose", str(rec)), run_cli("diagnose", str(out))
    assert (a.code, a.out) == (b.code, b.out)
    a, b = run_cli("report", str(rec), "--format", "json"), run_cli("report", str(out), "--format", "json")
    docs = [json.loads(a.out), json.loads(b.out)]
    assert docs[0].pop("paths") == [str(rec)] and docs[1].pop("paths") == [str(out)]  # the folder read: its own
    assert (a.code, docs[0]) == (b.code, docs[1])
    a = run_cli("merge", str(rec), "-o", str(tmp_path / "a.pftrace"))
    b = run_cli("merge", str(out), "-o", str(tmp_path / "b.pftrace"))
    assert a.code == b.code == 0 and a.out.splitlines()[1:3] == b.out.splitlines()[1:3]
    assert (tmp_path / "a.pftrace").stat().st_size == (tmp_path / "b.pftrace").stat().st_size


def test_compact_refuses_a_folder_that_holds_files(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("")
    ran = run_cli("compact", str(RECORDING), "-o", str(tmp_path / "out"))
    assert ran.code == 2
    assert "give a new or empty folder" in ran.err


def _compacted(tmp_path: Path) -> Path:
    out = tmp_path / "compact"
    assert run_cli("compact", str(RECORDING), "-o", str(out)).code == 0
    return out


def _edit_header(path: Path, edit) -> None:
    data = path.read_bytes()
    size = int.from_bytes(data[len(MAGIC):len(MAGIC) + 8], "little")
    start = len(MAGIC) + 8
    header = orjson.loads(data[start:start + size])
    edit(header)
    head = orjson.dumps(header)
    path.write_bytes(MAGIC + len(head).to_bytes(8, "little") + head + data[start + size:])


@pytest.mark.parametrize("edit, why", [
    (lambda h: h.update(rank=10**9), "rank"),
    (lambda h: h["groups"][0]["columns"].update(seq=[0, 10**9, "q"]), "column seq beyond the file"),
    (lambda h: h["groups"][0]["columns"].update(sig=[0, 3, "d"]), "column sig"),
    (lambda h: h["groups"][0].update(sigs=[]), "signature ids"),
    (lambda h: h["groups"][0].update(stack_table=[5000]), "stack_table"),
    (lambda h: h.update(stacks=[[["f.py", -3, "x"]]]), "a frame"),
    (lambda h: h["groups"][0].update(sigs=[["all_reduce", "[[4]]", None, None, None, "fr", []]]), "sizes"),
    (lambda h: h.update(pg_config=[["0", "default_pg", [0, 0]]]), "ranks of group"),
    (lambda h: h.update(unread=[["0", 5, 2]]), "unread entry"),
    (lambda h: h.update(unread_p2p=[7]), "unread_p2p"),
])
def test_a_malformed_columns_file_is_skipped_and_named(tmp_path, edit, why):
    out = _compacted(tmp_path)
    _edit_header(out / file_name(1), edit)
    run = run_cli("diagnose", str(out))
    assert run.code in (0, 1, 2), run.err  # 3 would be an internal error
    assert f"rank1.fr-columns: not a valid comm2perfetto columns file ({why}" in run.out


def test_truncated_or_foreign_columns_files_are_skipped_and_named(tmp_path):
    out = _compacted(tmp_path)
    data = (out / file_name(2)).read_bytes()
    (out / file_name(2)).write_bytes(data[: len(data) // 2])
    (out / file_name(3)).write_bytes(MAGIC + b"\xff" * 40)
    (out / "rank7.fr-columns").write_bytes((out / file_name(0)).read_bytes())  # rank 0's data under rank 7's name
    run = run_cli("diagnose", str(out))
    assert run.code in (1, 2), run.err
    assert "rank2.fr-columns: not a valid comm2perfetto columns file" in run.out
    assert "rank3.fr-columns: not a valid comm2perfetto columns file" in run.out
    assert "rank7.fr-columns: holds rank 0's data but its name says rank 7" in run.out
