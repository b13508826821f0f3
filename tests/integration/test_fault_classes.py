"""Fault classes whose verdicts used to guess (issue 32), each a real gloo job under `comm2perfetto record`: ranks
that create their groups in different orders, an all-to-all whose pairs disagree (gloo aborts the receiver),
object lists of different lengths, a rank holding the GIL from its first second. Each checks diagnose's verdict
and, where the job stalls, the live verdict: who is a culprit, who only a suspect, who a victim, and that no
hung job is ever OK. Jobs give gloo a short timeout so that a hang ends by itself, and run at once
(``class_jobs``)."""

from __future__ import annotations

import json

import pytest

from support.verdicts import diagnose

pytestmark = pytest.mark.integration

INIT = """
import datetime, os, re, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds={timeout}))
rank = dist.get_rank()
"""


def _job(body: str, timeout: int = 60) -> str:
    return INIT.format(timeout=timeout) + body


def _live(job) -> dict:
    """The live verdict `record` wrote at the stall (its first event: the stall)."""
    doc = json.loads((job.out / "stall-verdict.json").read_text())
    return doc["verdict"]


GROUP_ORDER = _job("""
t = torch.ones(4)
dist.all_reduce(t)
short = datetime.timedelta(seconds=12)  # a group's own timeout: the default group's is not inherited
if rank == 2:  # rank 2 creates Y before X: its X is c10d group 2, the others' group 1
    y = dist.new_group([0, 1, 2], group_desc="Y", timeout=short)
    x = dist.new_group([0, 1, 2], group_desc="X", timeout=short)
else:
    x = dist.new_group([0, 1, 2], group_desc="X", timeout=short)
    y = dist.new_group([0, 1, 2], group_desc="Y", timeout=short)
for step in range(3):
    dist.all_reduce(t, group=x)  # @x
    dist.all_reduce(t, group=y)
dist.destroy_process_group()
""", timeout=12)


def test_ranks_that_created_their_groups_in_another_order_are_never_ok(class_jobs):
    """Every rank hangs at its first collective on X, each in its own c10d group: the live verdict used to say
    OK. Both verdicts say group_mismatch, say that rank 2 deviates from ranks 0, 1 (every rank stays a suspect:
    which order the program meant is not in the data) and tell the two groups apart."""
    job = class_jobs["group_order"]
    live = _live(job)
    assert live["status"] == "desync", live
    first, *rest = live["findings"]
    assert (first["kind"], first["culprit_ranks"], first["suspect_ranks"]) == ("group_mismatch", [], [0, 1, 2])
    assert "X is group 1 on ranks 0, 1 and group 2 on rank 2" in first["detail"]
    assert rest and all(f["blocked_by"] == 1 for f in rest)
    assert {f["process_group"] for f in rest} == {"group 1 (X/Y)", "group 2 (Y/X)"}  # told apart
    code, doc = diagnose(job.out)
    assert (code, doc["status"]) == (1, "desync"), doc
    first, *rest = doc["findings"]
    assert (first["kind"], first["culprit_ranks"], first["suspect_ranks"]) == ("group_mismatch", [], [0, 1, 2])
    assert "Rank 2 created its groups in another order than ranks 0, 1." in first["detail"]
    assert doc["culprit_ranks"] == []
    groups = {f["process_group"] for f in rest}
    assert len(groups) == len(rest) and all(g.startswith("group ") for g in groups), groups  # told apart


SPLITS = _job("""
for step in range(4):
    out = torch.empty(9)
    # rank 0 sends 2 to rank 1 and 4 to rank 2 at step 2 (its total still 9); every rank expects 3 from each
    splits = [3, 2, 4] if (rank == 0 and step == 2) else [3, 3, 3]
    dist.all_to_all_single(out, torch.ones(9), output_split_sizes=[3, 3, 3], input_split_sizes=splits)  # @a2a
dist.destroy_process_group()
""")


def test_an_all_to_all_whose_splits_disagree_names_the_sender_and_the_rank_gloo_aborted_is_its_victim(class_jobs):
    job = class_jobs["splits"]
    code, doc = diagnose(job.out)
    assert (code, doc["status"]) == (1, "desync"), doc
    (f,) = doc["findings"]
    assert (f["kind"], f["op"], f["seq"], f["culprit_ranks"]) == ("size_mismatch", "all_to_all_single", 3, [0])
    assert f["victim_ranks"] == [2]  # received 4 where it expected 3: gloo's SIGABRT
    assert [(p["src"], p["dst"], p["sends"], p["expects"]) for p in f["evidence"]["pairs"]] == [
        (0, 1, 2, 3), (0, 2, 4, 3)]
    assert "rank 0 sends 2 elements to rank 1, which expects 3 from it" in f["detail"]
    assert f["evidence"]["splits_differ"] == 0 and "Rank 0 is in every pair that disagrees" in f["detail"]
    assert doc["ranks"]["2"]["state"] == "victim"


OBJECTS = _job("""
objects = [1, 2, 3] if rank == 0 else [None, None]  # rank 1 passes a shorter list
dist.broadcast_object_list(objects, src=0)  # @bol
dist.destroy_process_group()
""")


def test_object_lists_of_different_lengths_are_a_size_mismatch_with_both_ranks_suspects(class_jobs):
    """Two ranks, one list each, nothing else: the data shows that they disagree, not which one is wrong."""
    job = class_jobs["objects"]
    code, doc = diagnose(job.out)
    assert (code, doc["status"]) == (1, "desync"), doc
    (f,) = doc["findings"]
    assert (f["kind"], f["op"], f["culprit_ranks"], f["suspect_ranks"]) == (
        "size_mismatch", "broadcast_object_list", [], [0, 1])
    assert f["evidence"]["objects"] == {"0": 3, "1": 2}
    assert doc["culprit_ranks"] == []


GIL = _job("""
t = torch.ones(4)
if rank == 1:
    re.match(r"(a+)+$", "a" * 64 + "b")  # @gil: holds the GIL from the rank's first second
dist.all_reduce(t)  # @first
dist.destroy_process_group()
""", timeout=10)


def test_a_rank_holding_the_gil_from_its_first_second_is_frozen(class_jobs):
    """Rank 1's recorder thread never runs, so it never writes a heartbeat nor answers the gathering; its process
    runs all the same. It used to be a suspect (INCOMPLETE); it is frozen, and its stack at the stall is unknown,
    never the one it wrote on its way out."""
    job = class_jobs["gil"]
    live = _live(job)
    (f,) = live["findings"]
    assert (live["status"], f["kind"], f["culprit_ranks"]) == ("stuck", "rank_frozen", [1]), live
    assert "holds the GIL" in f["detail"]
    code, doc = diagnose(job.out)
    frozen = [f for f in doc["findings"] if f["kind"] == "rank_frozen"]
    assert code == 1 and [f["culprit_ranks"] for f in frozen] == [[1]], doc
    assert "1" not in frozen[0]["stacks"]
    assert doc["culprit_ranks"] == [1]


@pytest.fixture(scope="module")
def class_jobs(module_jobs):
    """The four jobs, recorded at once: two of them hang until gloo's timeout, and their waits overlap."""
    stall = {"record_args": ("--stall-after", "2")}
    return module_jobs.run_together({
        "group_order": (GROUP_ORDER, {"nproc": 3, **stall}),
        "splits": (SPLITS, {"nproc": 3}),
        "objects": (OBJECTS, {"nproc": 2}),
        "gil": (GIL, {"nproc": 2, **stall}),
    }, timeout=150)
