"""``comm2perfetto report`` on built dumps and traces: outputs, options and every kind of bad input."""

from __future__ import annotations

import gzip
import json
import os
import pickle

import pytest

from support.cli import run_cli
from support.factories import T0_NS, FrJob, steady_job
from support.kineto_fixtures import KinetoDoc

NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def _traces(folder, world=2, comm_us=(50.0, 100.0)):
    """Per rank: a 100 us GEMM at 0 and an NCCL kernel [50, 150]: overlap 50 of 100 us."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(world):
        doc = KinetoDoc(rank=rank, world_size=world)
        doc.gpu(7, "ampere_sgemm_128x64_tn", 0.0, 100.0)
        doc.gpu(13, NCCL, *comm_us)
        doc.write(folder / f"rank{rank}.pt.trace.json.gz")
    return folder


def test_json_to_a_file_by_suffix(tmp_path):
    _traces(tmp_path / "t")
    code, out, err = run_cli("report", str(tmp_path / "t"), "-o", str(tmp_path / "r.json"))
    assert code == 0 and out == "" and "wrote" in err
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["version"] == 1 and doc["ranks"]["1"]["overlap_pct"] == pytest.approx(50.0)


def test_hta_rounding_rounds_kernels_inward_to_whole_microseconds(tmp_path):
    """GEMM [0, 100], NCCL [50.4, 150.4]: exactly 49.6 of 100 us overlap; rounded as HTA does, the NCCL
    kernel is [51, 150] and overlaps 49 of 99 us."""
    _traces(tmp_path / "t", world=1, comm_us=(50.4, 100.0))
    exact = json.loads(run_cli("report", str(tmp_path / "t"), "--format", "json")[1])
    code, out, _ = run_cli("report", str(tmp_path / "t"), "--format", "json", "--hta-rounding")
    rounded = json.loads(out)
    assert code == 0
    assert exact["ranks"]["0"]["overlap_pct"] == pytest.approx(49.6)
    assert rounded["ranks"]["0"]["overlap_pct"] == pytest.approx(100 * 49 / 99)
    assert any("--hta-rounding" in note for note in rounded["notes"])
    assert not any("--hta-rounding" in note for note in exact["notes"])


def test_fr_dumps_alone_give_collectives_and_stragglers(tmp_path):
    fr = FrJob(world=4)
    for i in range(3):
        for r in fr.ranks:
            fr.collective(r, "all_reduce", [[256]], t_ns=T0_NS + i * 1_000_000 + (3 - r) * 20_000)
    fr.write(tmp_path)
    code, out, _ = run_cli("report", str(tmp_path), "--format", "json")
    doc = json.loads(out)
    assert code == 0
    assert doc["stragglers"][0]["rank"] == 0 and doc["stragglers"][0]["last_arrivals"] == 3
    assert doc["collectives"][0]["count"] == 3 and doc["collectives"][0]["bytes"] == 3 * 256 * 4


def test_csv_to_stdout_has_both_tables(tmp_path):
    steady_job(world=2, steps=4).write(tmp_path)
    code, out, _ = run_cli("report", str(tmp_path), "--format", "csv")
    ranks, collectives = out.strip().split("\n\n")
    assert code == 0 and ranks.startswith("rank,") and collectives.startswith("op,")
    assert len(collectives.splitlines()) == 1 + 4  # header + the four op families of steady_job


def test_depth_and_steps_validation(tmp_path):
    steady_job(world=2, steps=1).write(tmp_path)
    code, _, err = run_cli("report", str(tmp_path), "--depth", "0")
    assert code == 2 and "--depth" in err
    for bad in ("x", "3-1", "-2"):
        code, _, err = run_cli("report", str(tmp_path), "--steps", bad)
        assert code == 2 and "--steps" in err, bad


def test_unwritable_outputs(tmp_path):
    steady_job(world=2, steps=1).write(tmp_path)
    code, _, err = run_cli("report", str(tmp_path), "-o", "/proc/comm2perfetto-report.json")
    assert code == 2 and "cannot write /proc/comm2perfetto-report.json" in err
    code, _, err = run_cli("report", str(tmp_path), "--plot", str(tmp_path / "nope" / "r.html"))
    assert code == 2 and "does not exist" in err
    code, _, err = run_cli("report", str(tmp_path), "--plot", str(tmp_path / "r.pdf"))
    assert code == 2 and ".html" in err


def test_a_kernel_no_cpu_op_enqueued_has_no_queue_delay_nor_size(tmp_path):
    """Kernels alone (no record_param_comms in the trace, no args): the kernel's begin stands in for the rank's
    arrival, so no queue delay is known (it read 0 s), nor any size (it read 0 B)."""
    _traces(tmp_path / "t")
    code, out, _ = run_cli("report", str(tmp_path / "t"), "--format", "json")
    (row,) = json.loads(out)["collectives"]
    assert (code, row["op"], row["count"], row["timed"], row["bytes"], row["queue_mean_s"]) == (
        0, "all_reduce", 1, 1, None, None)
    assert row["total_s"] == pytest.approx(100e-6)


def test_missing_input(tmp_path):
    code, _, err = run_cli("report", str(tmp_path / "nothing"))
    assert code == 2 and "nothing" in err


def test_plot_without_matplotlib_says_how_to_get_it(tmp_path, monkeypatch):
    import sys

    _traces(tmp_path / "t")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, _, err = run_cli("report", str(tmp_path / "t"), "--plot", str(tmp_path / "r.png"))
    assert code == 2 and "comm2perfetto[plot]" in err and "Traceback" not in err
    code, _, _ = run_cli("report", str(tmp_path / "t"), "--plot", str(tmp_path / "r.html"))
    # bars, and the lateness map of the one all_reduce (its kernel, of the one group the traces list)
    assert code == 0 and (tmp_path / "r.html").read_text().count("<svg") == 2


def test_corrupt_truncated_and_malicious_files_are_skipped_and_named(tmp_path):
    folder = _traces(tmp_path / "t", world=3)
    good = (folder / "rank2.pt.trace.json.gz").read_bytes()
    (folder / "rank2.pt.trace.json.gz").write_bytes(good[: len(good) // 2])  # truncated gzip
    (folder / "rank1.pt.trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "nam'))

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch pwned",))

    (folder / "evil.pkl").write_bytes(pickle.dumps(Evil(), protocol=2))
    code, out, _ = run_cli("report", str(folder), "--format", "json")
    doc = json.loads(out)
    assert code == 0 and not (folder / "pwned").exists()
    assert doc["ranks"]["0"]["overlap_pct"] == pytest.approx(50.0)
    text = " ".join(doc["notes"])
    assert "rank2.pt.trace.json.gz" in text and "rank1.pt.trace.json.gz" in text and "evil.pkl" in text


def test_traces_of_two_jobs_are_refused(tmp_path):
    _traces(tmp_path / "a", world=2)
    _traces(tmp_path / "b", world=4)
    code, _, err = run_cli("report", str(tmp_path / "a"), str(tmp_path / "b"))
    assert code == 2 and "--force" in err
    code, out, _ = run_cli("report", str(tmp_path / "a"), str(tmp_path / "b"), "--force", "--format", "json")
    assert code == 0 and any("--force" in n for n in json.loads(out)["notes"])
