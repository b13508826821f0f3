"""Plain, async and point-to-point calls of a real 2-rank gloo job, recorded by ``comm2perfetto record``.

Each recorded call is checked against the script (op, call site line, shapes, dtypes, bytes, peer) and against
the rank's Flight Recorder dumps (sequence number, FR op name, input sizes).
"""

from __future__ import annotations

import pytest

from support.torch_features import gloo_flight_recorder

pytestmark = pytest.mark.integration

JOB = """
from torch.distributed import all_reduce as early_all_reduce  # bound before init: the import hook patched it
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
peer = 1 - rank

t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)  # @all_reduce
assert t.tolist() == [3.0] * 4, t
b = torch.arange(3.0) if rank == 0 else torch.zeros(3)
dist.broadcast(b, src=0)  # @broadcast
assert b.tolist() == [0.0, 1.0, 2.0], b
gathered = torch.zeros(2 * world)
dist.all_gather_into_tensor(gathered, torch.full((2,), float(rank)))  # @all_gather_into_tensor
assert gathered.tolist() == [0.0, 0.0, 1.0, 1.0], gathered
scattered = torch.zeros(2)
dist.reduce_scatter_tensor(scattered, torch.ones(2 * world))  # @reduce_scatter_tensor
assert scattered.tolist() == [2.0, 2.0], scattered
work = dist.all_reduce(torch.ones(8), async_op=True)  # @async
work.wait()
if rank == 0:
    dist.send(torch.ones(5), dst=1)  # @send
    dist.isend(torch.ones(6), dst=1).wait()  # @isend
else:
    dist.recv(torch.zeros(5), src=0)  # @recv
    dist.irecv(torch.zeros(6), src=0).wait()  # @irecv
ops = [dist.P2POp(dist.isend, torch.ones(7), peer), dist.P2POp(dist.irecv, torch.zeros(7), peer)]
for w in dist.batch_isend_irecv(ops):  # @batch
    w.wait()
objects = [None] * world
dist.all_gather_object(objects, {"rank": rank})  # @all_gather_object
assert objects == [{"rank": 0}, {"rank": 1}], objects
early_all_reduce(torch.ones(9))  # @early
c10d.all_reduce(torch.ones(10))  # @c10d
dist.destroy_process_group()
"""

# (op, script marker, shapes, bytes, peer, async) per rank, in call order. Float32: 4 bytes per element.
P2P_BATCH = [[[7], [7]], 2 * 7 * 4]
EXPECTED = {
    0: [("all_reduce", "@all_reduce", [[4]], 16, None, False),
        ("broadcast", "@broadcast", [[3]], 12, 0, False),
        ("all_gather_into_tensor", "@all_gather_into_tensor", [[2]], 8, None, False),
        ("reduce_scatter_tensor", "@reduce_scatter_tensor", [[4]], 16, None, False),
        ("all_reduce", "@async", [[8]], 32, None, True),
        ("send", "@send", [[5]], 20, 1, False),
        ("isend", "@isend", [[6]], 24, 1, True),
        ("batch_isend_irecv", "@batch", *P2P_BATCH, [["isend", 1], ["irecv", 1]], True),
        ("all_gather_object", "@all_gather_object", [], None, None, False),
        ("all_reduce", "@early", [[9]], 36, None, False),
        ("all_reduce", "@c10d", [[10]], 40, None, False)],
    1: [("all_reduce", "@all_reduce", [[4]], 16, None, False),
        ("broadcast", "@broadcast", [[3]], 12, 0, False),
        ("all_gather_into_tensor", "@all_gather_into_tensor", [[2]], 8, None, False),
        ("reduce_scatter_tensor", "@reduce_scatter_tensor", [[4]], 16, None, False),
        ("all_reduce", "@async", [[8]], 32, None, True),
        ("recv", "@recv", [[5]], 20, 0, False),
        ("irecv", "@irecv", [[6]], 24, 0, True),
        ("batch_isend_irecv", "@batch", *P2P_BATCH, [["isend", 0], ["irecv", 0]], True),
        ("all_gather_object", "@all_gather_object", [], None, None, False),
        ("all_reduce", "@early", [[9]], 36, None, False),
        ("all_reduce", "@c10d", [[10]], 40, None, False)],
}
P2P_OPS = {"send", "recv", "isend", "irecv", "batch_isend_irecv"}
# The Flight Recorder name gloo gives each op: all_gather_into_tensor is its all_gather, and gloo implements
# reduce_scatter_tensor as an all_reduce of the whole input.
FR_NAME = {"all_reduce": "gloo:all_reduce", "broadcast": "gloo:broadcast",
           "all_gather_into_tensor": "gloo:all_gather", "reduce_scatter_tensor": "gloo:all_reduce",
           "all_gather_object": "gloo:all_gather"}


@pytest.fixture(scope="module")
def plain_job(module_jobs):
    job = module_jobs.run(JOB, record_args=["--stall-after", "30"])
    assert job.returncode == 0, job.explain()
    return job


def test_every_rank_logs_and_closes_cleanly(plain_job):
    assert sorted(p.name for p in plain_job.out.glob("rank*.events.jsonl")) == \
        ["rank0.events.jsonl", "rank1.events.jsonl"]
    for rank in (0, 1):
        log = plain_job.log(rank)
        assert log.problems == []
        assert log.closed_reason == "exit"
        assert (log.rank, log.world_size, log.header["backend"]) == (rank, 2, "gloo")
        assert log.header["config"]["stall_after_s"] == 30.0
        group = log.groups[0]
        assert (group.name, group.desc, list(group.ranks), group.backend) == ("0", "default_pg", [0, 1], "gloo")
        # Both ranks of one run carry the launcher's run id.
        assert log.header["run_id"] == plain_job.log(0).header["run_id"] != ""


@pytest.mark.parametrize("rank", [0, 1])
def test_calls_match_the_script(plain_job, rank):
    calls = plain_job.log(rank).calls
    assert [c.op for c in calls] == [e[0] for e in EXPECTED[rank]]
    for call, (op, marker, shapes, nbytes, peer, is_async) in zip(calls, EXPECTED[rank]):
        where = f"{op} at {marker}"
        assert call.site == f"job.py:{plain_job.line_of(marker)} <module>", where
        assert call.shapes == shapes, where
        assert call.dtypes == ["Float"] * len(shapes), where
        assert call.nbytes == nbytes, where
        assert call.peer == peer, where
        assert call.is_async is is_async, where
        assert call.gid == 0 and call.error is None and call.step == 0, where
        assert call.nvtx == () and call.module is None and call.pass_ is None, where
        assert call.t_return_ns is not None and call.t_return_ns >= call.t_call_ns, where
        assert (call.seq is None) == (op in P2P_OPS), where
    # Calls are recorded in the order they were made.
    assert [c.t_call_ns for c in calls] == sorted(c.t_call_ns for c in calls)


@pytest.mark.parametrize("rank", [0, 1])
def test_async_all_reduce_has_a_completion_record(plain_job, rank):
    call = next(c for c in plain_job.log(rank).calls if c.site.startswith(f"job.py:{plain_job.line_of('@async')} "))
    assert call.is_async
    assert call.t_done_ns is not None, "no 'd' record for the async all_reduce"
    assert call.t_done_ns >= call.t_return_ns
    assert call.t_end_ns == call.t_done_ns


@pytest.mark.parametrize("rank", [0, 1])
def test_sequence_numbers_match_flight_recorder(plain_job, rank):
    """A recorded collective's seq is the ``collective_seq_id`` of the FR entry for the same op and inputs,
    also after point-to-point ops, which advance gloo's own counter but get no FR number (nor entry). Torch
    2.4-2.7 have no Flight Recorder for gloo: there the numbering alone is checked."""
    log = plain_job.log(rank)
    fr = gloo_flight_recorder()
    entries = [e for e in plain_job.fr_entries(rank) if e["process_group"][0] == "0"]
    assert bool(plain_job.fr_dumps(rank)) is fr, "a Flight Recorder dump if and only if gloo has one"
    by_seq = {e["collective_seq_id"]: e for e in entries}
    assert len(by_seq) == len(entries)

    last = 0  # the last collective's number so far
    covered: list[int] = []
    for call in log.calls:
        if call.op in P2P_OPS:
            assert call.seq is None and call.seq_last == last, call.op  # p2p: no number of its own
            continue
        assert call.seq == last + 1, f"{call.op}: seq {call.seq} after {last}"
        last = call.seq_last
        if not fr:
            continue
        for seq in range(call.seq, call.seq_last + 1):
            entry = by_seq.get(seq)
            assert entry is not None, f"{call.op} seq {seq}: no FR entry (FR has {sorted(by_seq)})"
            assert entry["profiling_name"] == FR_NAME[call.op], call.op
            covered.append(seq)
        if call.shapes:
            assert by_seq[call.seq]["input_sizes"] == call.shapes, call.op
            assert by_seq[call.seq]["input_dtypes"] == call.dtypes, call.op
    # all_gather_object issues two all_gathers (sizes, then payload) and its record covers both.
    ago = next(c for c in log.calls if c.op == "all_gather_object")
    assert ago.seq_last - ago.seq == 1
    if not fr:
        return
    # Every collective FR saw on this rank came from a recorded call: nothing was missed or invented.
    assert sorted(covered) == sorted(by_seq) == list(range(1, len(by_seq) + 1))
    # gloo keeps no FR entry for point-to-point ops.
    assert not [e for e in entries if e.get("is_p2p")]


def test_flight_recorder_dumps_are_logged(plain_job):
    for rank in (0, 1):
        log = plain_job.log(rank)
        reasons = [reason for _t, _name, reason in log.fr_dumps]
        assert reasons == (["destroy", "exit"] if gloo_flight_recorder() else [])  # none on torch 2.4-2.7
        names = [name for _t, name, _reason in log.fr_dumps]
        assert names == [p.name for p in plain_job.fr_dumps(rank)]
    assert plain_job.job_file()["exit_status"] == 0
