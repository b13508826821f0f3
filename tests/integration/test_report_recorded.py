"""``comm2perfetto report`` on a real 2-rank gloo job with known compute and a known straggler.

Each of 4 steps, on both ranks: 40 ms of busy work inside ``comm2perfetto.range("compute")``; rank 1 then
sleeps 100 ms before a blocking all_reduce (so rank 0 waits for it there, and rank 1 arrives last); then an
async all_reduce runs while 20 ms of busy work computes in a second range. The report must show it:
about 240 ms of compute per rank, rank 0's exposed communication holding the 4 waits, communication overlapped
with compute on both ranks, rank 1 ranked first straggler, 8 all-reduces of 4 KiB each.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from support.cli import Ran, run_cli_process

pytestmark = pytest.mark.integration

STEPS = 4
COMPUTE_S, OVERLAPPED_S, LAG_S = 0.040, 0.020, 0.100

KNOWN_WORK_JOB = f"""
import time
import torch
import torch.distributed as dist
import comm2perfetto


def busy(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range({STEPS}):
    with comm2perfetto.range("compute"):
        busy({COMPUTE_S})
    if rank == 1:
        time.sleep({LAG_S})  # the straggler
    dist.all_reduce(torch.ones(1024))
    work = dist.all_reduce(torch.ones(1024), async_op=True)
    with comm2perfetto.range("overlapped compute"):
        busy({OVERLAPPED_S})
    work.wait()
    comm2perfetto.step()
dist.destroy_process_group()
"""


def report(*args: str | Path) -> Ran:
    return run_cli_process("report", *map(str, args), timeout=120)


@pytest.fixture(scope="module")
def known_work(module_jobs):
    result = module_jobs.run(KNOWN_WORK_JOB, record_args=["--stall-after", "off"])
    assert result.returncode == 0, result.explain()
    return result


@pytest.fixture(scope="module")
def doc(known_work):
    done = report(known_work.out, "--format", "json")
    assert done.code == 0, done.err
    return json.loads(done.out)


def _ranges_s(known_work, rank: int, steps: tuple[int, int] | None = None) -> float:
    """The seconds this rank's recorded ranges cover (in steps A-B): what compute must be on the CPU basis,
    whatever the machine's load stretched them to."""
    log = known_work.log(rank)
    begin, end = 0, float("inf")
    if steps is not None:
        starts = {step: t for step, t, _source in log.steps}
        begin, end = starts[steps[0]], starts.get(steps[1] + 1, float("inf"))
    return sum(r.t_end_ns - r.t_begin_ns for r in log.ranges if begin <= r.t_begin_ns < end) / 1e9


def test_compute_is_the_busy_work(doc, known_work):
    expected = STEPS * (COMPUTE_S + OVERLAPPED_S)
    for rank in ("0", "1"):
        row = doc["ranks"][rank]
        assert row["basis"] == "cpu"
        assert row["compute_s"] >= expected, row  # busy() never returns early
        assert row["compute_s"] == pytest.approx(_ranges_s(known_work, int(rank)), rel=1e-6), row


def test_the_wait_for_the_straggler_is_exposed_communication(doc):
    rank0, rank1 = doc["ranks"]["0"], doc["ranks"]["1"]
    # rank 0 blocks in each blocking all_reduce until rank 1 arrives, 100 ms after it
    assert rank0["exposed_comm_s"] > STEPS * LAG_S * 0.8, rank0
    assert rank0["exposed_comm_s"] > 2 * rank1["exposed_comm_s"], (rank0, rank1)
    for row in (rank0, rank1):
        assert row["overlapped_comm_s"] > 0, row  # the async all_reduce completes while the range computes
        assert row["exposed_comm_s"] == pytest.approx(row["comm_s"] - row["overlapped_comm_s"])
        assert row["span_s"] >= row["compute_s"] + row["exposed_comm_s"] - 1e-9


def test_rank_1_is_the_straggler(doc):
    first = doc["stragglers"][0]
    assert first["rank"] == 1
    assert first["last_arrivals"] >= STEPS          # every blocking all_reduce, at least
    assert first["mean_lateness_s"] > LAG_S / 4     # 100 ms late at half the all-reduces


def test_collectives_are_counted_with_their_sizes(doc):
    [row] = [r for r in doc["collectives"] if r["op"] == "all_reduce"]
    assert row["count"] == 2 * STEPS and row["timed"] == 2 * STEPS
    assert row["bytes"] == 2 * STEPS * 1024 * 4
    assert row["group_size"] == 2
    assert row["algbw_gbps"] > 0 and row["busbw_gbps"] == pytest.approx(row["algbw_gbps"])  # 2(n-1)/n = 1


def test_steps_and_modules(doc):
    assert [s["step"] for s in doc["steps"]][:STEPS] == list(range(STEPS))
    step1 = doc["steps"][1]
    assert step1["ranks"]["0"]["compute_s"] >= COMPUTE_S + OVERLAPPED_S
    [row] = [r for r in doc["modules"] if r["op"] == "all_reduce"]
    assert row["path"] == "(outside any module)" and row["count"] == 2 * STEPS and row["ranks"] == 2


def test_text_csv_and_plot_outputs(known_work, tmp_path):
    text = report(known_work.out)
    assert text.code == 0, text.err
    assert "all_reduce" in text.out and "straggler" in text.out.lower()
    done = report(known_work.out, "--format", "csv", "-o", tmp_path / "job.csv", "--plot", tmp_path / "job.html")
    assert done.code == 0, done.err
    with open(tmp_path / "job.ranks.csv", newline="") as f:
        ranks = list(csv.DictReader(f))
    assert [r["rank"] for r in ranks] == ["0", "1"]
    html = (tmp_path / "job.html").read_text()
    assert html.count("<svg") >= 2


def test_steps_option_narrows_the_figures(known_work, doc):
    done = report(known_work.out, "--format", "json", "--steps", "1-2")
    assert done.code == 0, done.err
    narrow = json.loads(done.out)
    assert [s["step"] for s in narrow["steps"]] == [1, 2]
    assert narrow["ranks"]["0"]["compute_s"] >= 2 * (COMPUTE_S + OVERLAPPED_S)
    assert narrow["ranks"]["0"]["compute_s"] == pytest.approx(_ranges_s(known_work, 0, (1, 2)), rel=1e-6)
    assert narrow["collectives"][0]["count"] == 4  # two all-reduces a step


def test_bad_input(tmp_path, known_work):
    missing = report(tmp_path / "nowhere")
    assert missing.code == 2 and "nowhere" in missing.err and "Traceback" not in missing.err
    bad_steps = report(known_work.out, "--steps", "5-2")
    assert bad_steps.code == 2 and "--steps" in bad_steps.err
    bad_plot = report(known_work.out, "--plot", tmp_path / "job.pdf")
    assert bad_plot.code == 2 and ".html" in bad_plot.err
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a dump")
    nothing = report(empty)
    assert nothing.code == 2 and "profiler trace" in nothing.err


def test_profiler_traces_alone_are_enough(tmp_path):
    from support.kineto_fixtures import KinetoDoc

    for rank in (0, 1):
        doc = KinetoDoc(rank=rank)
        doc.gpu(7, "ampere_sgemm_128x64_tn", 0.0, 100.0)
        doc.gpu(13, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 50.0, 100.0)
        doc.write(tmp_path / f"trace_rank{rank}.json")
    done = report(tmp_path, "--format", "json")
    assert done.code == 0, done.err
    out = json.loads(done.out)
    assert out["basis"] == "gpu" and sorted(out["ranks"]) == ["0", "1"]
    assert out["job"]["overlap_pct"] == pytest.approx(100 * 50 / 100)  # comm [50, 150] over compute [0, 100]
    # the kernels name no group: of the only one the traces list, each rank's one all_reduce, begun together
    assert [(c["op"], c["process_group"], c["count"]) for c in out["collectives"]] == [("all_reduce", "default_pg", 1)]
    assert [(s["rank"], s["matched"], s["mean_lateness_s"]) for s in out["stragglers"]] == [(0, 1, 0.0), (1, 1, 0.0)]
