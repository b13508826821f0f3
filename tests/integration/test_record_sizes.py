"""The sizes gloo checks only by aborting a rank, recorded from a real 3-rank gloo job under ``comm2perfetto
record``: all_to_all_single's split sizes (uneven, and not given), all_to_all's tensors, the object collectives'
list lengths, in each rank's event log and in the loaded Job; and the op the user called winning over the name
gloo's Flight Recorder gives it, in every view."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.torch_features import gloo_flight_recorder

pytestmark = pytest.mark.integration

# Rows rank r sends to rank d in the uneven all_to_all_single: rank 1 keeps none of its own, rank 2 none either.
SPLITS = [[1, 2, 3], [4, 0, 1], [2, 2, 0]]
ROW = 2  # elements per row: the tensors are (rows, 2)

JOB = f"""
import torch
import torch.distributed as dist

SPLITS = {SPLITS}
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
send = SPLITS[rank]
expect = [SPLITS[src][rank] for src in range(world)]
received = torch.zeros(sum(expect), {ROW})
dist.all_to_all_single(received, torch.full((sum(send), {ROW}), float(rank)), expect, send)  # @uneven
assert received[:, 0].tolist() == [float(src) for src in range(world) for _ in range(expect[src])], received
even = torch.zeros(6)
dist.all_to_all_single(even, torch.full((6,), float(rank)))  # @even
assert even.tolist() == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0], even
outputs = [torch.zeros(1, 2) for _ in range(world)]
dist.all_to_all(outputs, [torch.full((1, 2), float(10 * rank + d)) for d in range(world)])  # @all_to_all
assert [o[0, 0].item() for o in outputs] == [10.0 * src + rank for src in range(world)], outputs
objects = ["one", {{"two": 2}}, 3.0] if rank == 0 else [None] * 3
dist.broadcast_object_list(objects, src=0)  # @broadcast_object_list
assert objects == ["one", {{"two": 2}}, 3.0], objects
gathered = [None] * world
dist.all_gather_object(gathered, rank)  # @all_gather_object
assert gathered == list(range(world)), gathered
at_two = [None] * world if rank == 2 else None
dist.gather_object(rank * 10, at_two, dst=2)  # @gather_object
mine = [None]
dist.scatter_object_list(mine, [7, 8, 9] if rank == 1 else None, src=1)  # @scatter_object_list
assert mine == [7 + rank], mine
if rank == 0:
    dist.send_object_list(["a", "b"], dst=2)  # @send_object_list
elif rank == 2:
    pair = [None, None]
    dist.recv_object_list(pair, src=0)  # @recv_object_list
    assert pair == ["a", "b"], pair
dist.destroy_process_group()
"""

# What each rank's `b` record says, in call order: (op, the script's marker of the call, sizes field).
SIZES = {
    rank: [("all_to_all_single", "@uneven", [SPLITS[rank], [SPLITS[s][rank] for s in range(3)],
                                             [sum(SPLITS[s][rank] for s in range(3)), ROW]]),
           ("all_to_all_single", "@even", [None, None, [6]]),
           ("all_to_all", "@all_to_all", [[[1, 2]] * 3]),
           ("broadcast_object_list", "@broadcast_object_list", [3]),
           ("all_gather_object", "@all_gather_object", [3]),
           ("gather_object", "@gather_object", [3 if rank == 2 else None]),
           ("scatter_object_list", "@scatter_object_list", [3 if rank == 1 else None])]
    + {0: [("send_object_list", "@send_object_list", [2])], 1: [],
       2: [("recv_object_list", "@recv_object_list", [2])]}[rank]
    for rank in range(3)
}


@pytest.fixture(scope="module")
def sizes_job(module_jobs):
    job = module_jobs.run(JOB, nproc=3, record_args=["--stall-after", "30"])
    assert job.returncode == 0, job.explain()
    return job


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_the_event_log_holds_the_sizes_the_job_passed(sizes_job, rank):
    with open(sizes_job.out / f"rank{rank}.events.jsonl", "rb") as f:
        records = [json.loads(line) for line in f.read().rstrip(b"\0").splitlines()[1:]]
    begins = [r for r in records if r[0] == "b"]
    assert [(r[3], r[15] if len(r) > 15 else None) for r in begins] == [(op, sizes) for op, _, sizes in SIZES[rank]]
    log = sizes_job.log(rank)
    assert log.problems == []
    assert [c.site for c in log.calls] == [f"job.py:{sizes_job.line_of(marker)} <module>"
                                           for _, marker, _ in SIZES[rank]]


def test_the_loaded_job_carries_each_ranks_splits_and_list_lengths(sizes_job):
    from comm2perfetto.diagnose.diagnosis import diagnose
    from comm2perfetto.match import load_job
    from comm2perfetto.model import Exchange

    job = load_job([sizes_job.out])
    assert diagnose(job).status == "ok"
    cols = {c.seq: c for c in job.collectives["0[0,1,2]"]}
    by_op: dict[str, list] = {}
    for c in cols.values():
        by_op.setdefault(c.op, []).append(c)
    uneven, even = by_op["all_to_all_single"]
    # The per-peer matrix, as each rank's signature has it, is what the job sent: rows of 2 elements.
    assert [uneven.signatures[r].exchange.send for r in range(3)] == [tuple(ROW * n for n in row) for row in SPLITS]
    assert [uneven.signatures[r].exchange.recv for r in range(3)] == [
        tuple(ROW * SPLITS[s][r] for s in range(3)) for r in range(3)]
    assert {even.signatures[r].exchange for r in range(3)} == {Exchange((2, 2, 2), (2, 2, 2), False, False)}
    (a2a,) = by_op["all_to_all"]
    assert {a2a.signatures[r].exchange for r in range(3)} == {Exchange((2, 2, 2), (2, 2, 2))}
    # Each object collective is two or three collectives (sizes, then the pickled objects); its first has the length.
    expected = {"broadcast_object_list": (3, 3, 3), "all_gather_object": (3, 3, 3),
                "gather_object": (None, None, 3), "scatter_object_list": (None, 3, None)}
    for op, lengths in expected.items():
        first = min(by_op[op], key=lambda c: c.seq)
        assert tuple(sig.objects for sig in first.signatures) == lengths, op
        assert all(sig.objects is None for c in by_op[op] if c is not first for sig in c.signatures), op
    assert sorted(by_op) == ["all_gather_object", "all_to_all", "all_to_all_single", "broadcast_object_list",
                             "gather_object", "scatter_object_list"]
    # Gloo's Flight Recorder names them after what implements them; the signature keeps its name.
    fr_names = {c.signatures[0].fr_op for c in cols.values()}
    assert fr_names == ({"all_to_all", "broadcast", "all_gather", "gather", "scatter"} if gloo_flight_recorder()
                        else {None})
    # Object sends are not paired with receives (torch sends sizes then bytes); their calls carry the length.
    assert [(c.op, c.objects) for c in job.logs[0].calls if c.op.endswith("object_list")] == [
        ("broadcast_object_list", 3), ("scatter_object_list", None), ("send_object_list", 2)]
    assert [(c.op, c.objects) for c in job.logs[2].calls if c.op == "recv_object_list"] == [("recv_object_list", 2)]


def test_report_and_trace_show_what_each_rank_sent_each_rank_to_the_byte(sizes_job, tmp_path):
    """The report's matrix of a real dispatch, and the trace's slices of it: the uneven all_to_all_single plus
    the even one (2 elements to each rank), and all_to_all's tensors (2 elements each), in Float's 4 bytes."""
    from support.cli import run_cli

    plot = tmp_path / "report.html"
    ran = run_cli("report", str(sizes_job.out), "--format", "json", "--plot", str(plot))
    assert ran.code == 0, ran.err
    rows = {x["op"]: x for x in json.loads(ran.out)["all_to_all"]}
    single = [[4 * (ROW * n + 2) for n in row] for row in SPLITS]
    assert rows["all_to_all_single"]["sent_bytes"] == single
    assert rows["all_to_all_single"]["received_bytes"] == [sum(row[d] for row in single) for d in range(3)]
    assert (rows["all_to_all_single"]["count"], rows["all_to_all_single"]["covered"]) == (2, 2)
    assert rows["all_to_all_single"]["hot_ranks"] == [0]  # 7 rows in, against 4 and 4
    assert rows["all_to_all"]["sent_bytes"] == [[8, 8, 8]] * 3 and rows["all_to_all"]["imbalance"] == 1.0
    assert all(t is not None and t > 0 for x in rows.values() for t in x["time_s"])  # the recorder timed each call
    assert plot.read_text().count('aria-label="bytes sent per pair of ranks') == 2

    trace = tmp_path / "trace.json"
    assert run_cli("merge", str(sizes_job.out), "-o", str(trace)).code == 0
    sent = sorted(e["args"]["bytes_to_each"] for e in json.loads(trace.read_text())["traceEvents"]
                  if e.get("name") == "all_to_all_single" and e.get("cat") == "collective")
    assert sent == sorted([str([4 * ROW * n for n in row]) for row in SPLITS] + ["[8, 8, 8]"] * 3)


OP_MISMATCH = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
out = torch.zeros(2)
dist.reduce_scatter_tensor(out, torch.ones(2 * world))
if rank < 2:
    dist.reduce_scatter_tensor(out, torch.ones(2 * world))  # @intended
else:
    dist.all_reduce(torch.ones(2 * world))  # @diverged: gloo runs it as the same all_reduce, and completes
dist.destroy_process_group()
"""


def test_every_view_names_the_op_the_user_called(record_job):
    """Gloo's Flight Recorder names reduce_scatter_tensor all_reduce; the recorder saw the call."""
    job = record_job.run(OP_MISMATCH, nproc=3)
    assert job.returncode == 0, job.explain()

    def cli(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "comm2perfetto.cli", *args], capture_output=True, text=True,
                              timeout=120, check=False)
        assert done.returncode in (0, 1), done.stderr
        return done.stdout

    verdict = json.loads(cli("diagnose", str(job.out), "--format", "json"))
    (finding,) = verdict["findings"]
    assert (finding["kind"], finding["seq"], finding["op"]) == ("op_mismatch", 2, "reduce_scatter_tensor")
    assert "rank 2: all_reduce" in finding["detail"]
    report = json.loads(cli("report", str(job.out), "--format", "json"))
    assert sorted((row["op"], row["count"]) for row in report["collectives"]) == [("reduce_scatter", 2)]
    trace = job.cwd / "trace.json"
    cli("merge", str(job.out), "-o", str(trace))
    names = [e["name"] for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "collective"]
    assert sorted(names) == ["all_reduce"] + ["reduce_scatter_tensor"] * 5, names
