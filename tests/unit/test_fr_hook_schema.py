"""Flight Recorder of torch 2.11+ (one backend-agnostic ``FlightRecorderHook``): operation names carry the backend
(``nccl2:``, ``ncclx:``), a backend without a completion hook has its entries retired at issue (``scheduled``, no
times, ``retired: true``): completion unknown, never a hang; NCCLX builds add ``nccl_comm_state``."""

from __future__ import annotations

import pickle

import pytest

from comm2perfetto.model import COMPLETED, SCHEDULED, UNKNOWN, gpu_backend
from comm2perfetto.sources.fr.dump import read_fr_dump
from comm2perfetto.sources.fr.ingest import build_rank_trace
from comm2perfetto.sources.fr.tables import SignatureTable, StackTable
from support.cli import run_cli
from support.factories import FrJob


def _retired_at_issue(job: FrJob, rank: int) -> None:
    """What the hook writes for a backend with no completion: every entry retired at issue, no times."""
    for e in job.entries[rank]:
        e.update(state="scheduled", retired=True, time_discovered_started_ns=None, time_discovered_completed_ns=None)


def _hook_job(backend: str, n: int = 30) -> FrJob:
    job = FrJob(world=2, backend=backend, version="2.11")
    for _ in range(n):
        for r in job.ranks:
            job.collective(r, "all_reduce", [[1024]])
    for r in job.ranks:
        _retired_at_issue(job, r)
    return job


@pytest.mark.parametrize("backend", ["nccl2", "ncclx"])
def test_entries_retired_at_issue_are_completion_unknown_not_stuck(tmp_path, backend):
    _hook_job(backend).write(tmp_path)
    ran = run_cli("diagnose", tmp_path)
    assert ran.code == 0, ran.out  # was: STUCK on all_reduce #1, culprit 1 (1.00 us after the first), exit 1
    assert "STUCK" not in ran.out
    assert f"retired 60 entries of {backend} on ranks 0, 1 as they were issued" in ran.out
    assert "whether they completed is unknown" in ran.out
    assert gpu_backend(backend)  # a GPU library: its Flight Recorder times are no durations


def test_issued_and_never_completed_is_still_stuck(tmp_path):
    """The same backend's last entry not retired: issued, never completed, on both ranks: a hang."""
    job = _hook_job("nccl2", n=3)
    for r in job.ranks:
        job.entries[r][-1]["retired"] = False
    job.write(tmp_path)
    ran = run_cli("diagnose", tmp_path)
    assert ran.code == 1
    assert "all_reduce #3" in ran.out and "retired 4 entries" in ran.out


def test_states_by_entry():
    """Only an entry both scheduled and retired is unknown; NCCL's own scheduled, unretired batch ops stay as
    they are (their closing entry gives them its state)."""
    job = FrJob(world=2, backend="nccl2", version="2.11")
    for _ in range(3):
        job.collective(0, "all_reduce", [[4]])
    job.entries[0][1].update(state="scheduled", retired=True)
    job.entries[0][2].update(state="scheduled", retired=False)
    dump = read_fr_dump("nccl_trace_rank_0", pickle.dumps(job.document(0), protocol=2))
    trace, _ = build_rank_trace(0, [dump], StackTable(), SignatureTable())
    (track,) = trace.groups.values()
    assert track.states == [COMPLETED, UNKNOWN, SCHEDULED]
    assert (trace.backend, trace.retired_at_issue) == ("nccl2", 1)


def test_nccl_comm_state_is_shown_and_a_damaged_one_named(tmp_path):
    job = _hook_job("ncclx", n=2)
    docs = [job.document(r) for r in job.ranks]
    docs[0]["nccl_comm_state"] = {"0x5a3f": {"commHash": "0x5a3f", "nRanks": "2", "CT_pendingColls": "[]"}}
    docs[1]["nccl_comm_state"] = {"0x5a3f": ["not", "a", "table"]}
    for r, doc in enumerate(docs):
        (tmp_path / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(doc, protocol=2))
    ran = run_cli("diagnose", tmp_path)
    assert ran.code == 0, ran.out
    text = " ".join(ran.out.split())
    assert ("NCCL's communicator state (nccl_comm_state), rank 0, communicator 0x5a3f: commHash=0x5a3f, nRanks=2, "
            "CT_pendingColls=[]") in text
    assert "nccl_trace_rank_1: nccl_comm_state of '0x5a3f' is not a table of strings; left out" in text
