"""A damaged Flight Recorder field is skipped and named, never evidence (sources/fr/fields.py): the cases the
property test over real recordings (tests/integration/test_damaged_fields_recorded.py) does not reach, on
synthetic dumps: several dumps of a rank, a send/recv, a coalesced collective, the dump's top-level keys."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import pytest

from comm2perfetto.cli import main
from comm2perfetto.diagnose.diagnosis import diagnose
from comm2perfetto.load_options import LoadOptions
from comm2perfetto.match import load_job
from comm2perfetto.sources.fr.dump import read_fr_dump
from comm2perfetto.sources.fr.ingest import build_rank_trace
from comm2perfetto.sources.fr.tables import SignatureTable, StackTable
from support.factories import FrJob


def _healthy(p2p: bool = False, coalesced: bool = False) -> FrJob:
    """Two ranks, four all-reduces (the third coalesced, or a send/recv after each, where asked)."""
    job = FrJob(world=2)
    for k in range(4):
        for r in (0, 1):
            job.collective(r, "all_reduce", [[4]],
                           coalesced=[("all_reduce", [[2]], [[2]])] * 2 if coalesced and k == 2 else None)
        if p2p:
            job.p2p(0, "send", 1, [[4]])
            job.p2p(1, "recv", 0, [[4]])
    return job


def _write(job: FrJob, folder: Path, edit: dict[int, dict[str, object]], *, rank: int = 1,
           which: str = "collective", index: int = 1) -> Path:
    """The job's dumps, with ``edit`` applied to the ``index``-th entry of ``which`` kind of rank ``rank``."""
    folder.mkdir(parents=True, exist_ok=True)
    for r in job.ranks:
        doc = job.document(r)
        if r == rank:
            entries = [e for e in doc["entries"] if e["is_p2p"] == (which == "p2p")]
            entries[index].update(edit)
        (folder / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(doc, protocol=2))
    return folder


def _verdict(folder: Path):
    job = load_job([folder], LoadOptions(stacks=False))
    d = diagnose(job)
    return d.status, [(f.kind, f.culprit_ranks, f.suspect_ranks) for f in d.findings], job.notes


@pytest.mark.parametrize("edit", [{"profiling_name": 7}, {"collective_seq_id": "x"}, {"p2p_seq_id": math.nan},
                                  {"is_p2p": "x"}, {"process_group": None, "pg_id": "x"}])
def test_a_damaged_send_or_recv_blames_no_one(tmp_path, edit):
    """Rank 1's second recv unreadable: its peer's send is not "unmatched" (sends and recvs pair by their
    order, which a lost recv leaves unknown on that group)."""
    status, findings, notes = _verdict(_write(_healthy(p2p=True), tmp_path, edit, which="p2p"))
    assert (status, findings) == ("ok", []), notes
    assert any(next(iter(edit)) in n for n in notes), notes


def test_a_lost_op_of_a_coalesced_collective_leaves_the_collective_unknown_not_different(tmp_path):
    """One op of rank 1's coalesced all_reduce #3 unreadable: #3 on rank 1 is unknown, not a coalesced group of
    one op fewer than rank 0's (an op mismatch)."""
    job = _healthy(coalesced=True)
    folder = _write(job, tmp_path, {"profiling_name": [5]}, index=3)  # #1, #2, then #3's ops
    status, findings, notes = _verdict(folder)
    assert (status, findings) == ("ok", []), notes
    trace, _ = build_rank_trace(1, [read_fr_dump(folder / "nccl_trace_rank_1")], StackTable(), SignatureTable())
    (track,) = trace.groups.values()
    assert track.seqs == [1, 2, 4] and trace.unread == {"0": ((3, 3),)}


def _two_dumps(tmp_path: Path, older: dict, newer: dict) -> list:
    """Rank 0's all_reduce #2 in two dumps, ``older`` and ``newer`` applied to it there."""
    job = _healthy()
    paths = []
    for n, edit in ((1, older), (2, newer)):
        doc = job.document(0)
        doc["entries"][1].update(edit)
        path = tmp_path / f"rank0.fr.{n}.pkl"
        path.write_bytes(pickle.dumps(doc, protocol=2))
        paths.append(path)
    return [read_fr_dump(p) for p in paths]


@pytest.mark.parametrize(("older", "newer", "state", "told"), [
    # the newer copy's state damaged: the older copy's, where final
    ({}, {"state": [5]}, "completed", "(read from the same record in rank0.fr.1.pkl)"),
    ({"state": "scheduled"}, {"state": [5]}, "unknown", "is [5], not a state Flight Recorder writes"),
    # a damaged record id: placed between its neighbours, the newer copy (its state) still wins
    ({"state": "scheduled"}, {"record_id": "x"}, "completed", "(read as 1, between its neighbours in rank0.fr.2.pkl)"),
    # a damaged name: read from the older copy
    ({}, {"profiling_name": None}, "completed", "(read from the same record in rank0.fr.1.pkl)"),
    # NaN and 1e40 creation times: no "different runs", the older copy's time
    ({}, {"time_created_ns": math.nan}, "completed", "(read from the same record in rank0.fr.1.pkl)"),
    ({}, {"time_created_ns": 1e40}, "completed", "(read from the same record in rank0.fr.1.pkl)"),
])
def test_a_field_damaged_in_one_dump_is_read_from_another(tmp_path, older, newer, state, told):
    trace, conflict = build_rank_trace(0, _two_dumps(tmp_path, older, newer), StackTable(), SignatureTable())
    (track,) = trace.groups.values()
    assert conflict is None and track.seqs == [1, 2, 3, 4] and track.states[1] == state and not trace.unread
    (note,) = trace.notes
    assert note.startswith("rank0.fr.2.pkl: 1 Flight Recorder field failed its check") and note.endswith(told), note
    if "time_created_ns" in newer:
        assert track.created_ns[1] == _healthy().entries[0][1]["time_created_ns"]


@pytest.mark.parametrize(("key", "value", "says"), [
    ("pg_config", "zero", "rank0.fr.1.pkl: pg_config is 'zero', not a table of groups"),
    ("pg_config", {"a": 1}, "rank0.fr.1.pkl: pg_config of group 'a' is 1, not a group's description"),
    ("pg_status", [5], "rank0.fr.1.pkl: pg_status is [5], not a table of groups"),
    ("pg_status", {"0": {"last_completed_collective": math.inf}},
     "rank0.fr.1.pkl: pg_status: last_completed_collective is inf, not what Flight Recorder writes"),
    ("version", math.nan, "rank0.fr.1.pkl: version is nan, not a version"),
    ("version", "zero", "rank0.fr.1.pkl: version is 'zero', not a version"),
])
def test_a_damaged_top_level_key_is_named(tmp_path, key, value, says):
    doc = _healthy().document(0)
    doc[key] = value
    path = tmp_path / "rank0.fr.1.pkl"
    path.write_bytes(pickle.dumps(doc, protocol=2))
    trace, _ = build_rank_trace(0, [read_fr_dump(path)], StackTable(), SignatureTable())
    assert any(n.startswith(says) for n in trace.notes), trace.notes
    assert [len(t) for t in trace.groups.values()] == [4]


def test_a_damaged_dtype_is_unknown_not_another_dtype(tmp_path):
    status, findings, notes = _verdict(_write(_healthy(), tmp_path, {"input_dtypes": "zero"}))
    assert (status, findings) == ("ok", []), notes
    assert any("input_dtypes of record 1 (all_reduce #2 on default_pg) is 'zero', not a list of dtypes" in n
               for n in notes), notes


def test_compact_columns_keep_what_is_unread(tmp_path):
    """``comm2perfetto compact`` writes the seqs and the send/recv pairing a skipped entry left unknown, and
    every command reads them back as from the dumps."""
    job = _healthy(p2p=True)
    dumps = _write(job, tmp_path / "dumps", {"collective_seq_id": "x"})
    doc = pickle.loads((dumps / "nccl_trace_rank_0").read_bytes())
    [e for e in doc["entries"] if e["is_p2p"]][2]["profiling_name"] = None
    (dumps / "nccl_trace_rank_0").write_bytes(pickle.dumps(doc, protocol=2))
    assert main(["compact", str(dumps), "-o", str(tmp_path / "compact")]) == 0
    coverage = [{k: (c.unread, c.unread_p2p) for k, c in load_job([folder]).coverage.items()}
                for folder in (dumps, tmp_path / "compact")]
    assert coverage[0] == coverage[1] == {(0, "0[0,1]"): ((), True), (1, "0[0,1]"): (((2, 2),), False)}
