"""The ``comm2perfetto diagnose`` command: exit status, JSON contract, text, errors; and no torch import."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from support.cli import run_cli
from support.factories import FrJob, steady_job


def _missing_rank_job(tmp_path):
    job = steady_job(world=4, steps=3)
    for r in (0, 1, 3):
        job.collective(r, "all_reduce", [[4]], state="started", site="train.py:57")
    job.write(tmp_path)


def test_healthy_exits_0(tmp_path):
    steady_job(world=2, steps=3).write(tmp_path)
    code, out, _ = run_cli("diagnose", str(tmp_path))
    assert code == 0 and out.startswith("OK: every collective matched on all ranks (world size 2")


def test_problem_exits_1_and_json_follows_the_contract(tmp_path):
    _missing_rank_job(tmp_path)
    code, out, _ = run_cli("diagnose", str(tmp_path), "--format", "json")
    doc = json.loads(out)
    assert code == 1
    assert {k: doc[k] for k in ("status", "world_size", "ranks_with_data")} == {
        "status": "stuck", "world_size": 4, "ranks_with_data": [0, 1, 2, 3]}
    (f,) = doc["findings"]
    assert {k: f[k] for k in ("kind", "process_group", "seq", "op", "ranks_joined", "ranks_missing",
                              "culprit_ranks")} == {
        "kind": "missing_ranks", "process_group": "default_pg", "seq": 4, "op": "all_reduce",
        "ranks_joined": [0, 1, 3], "ranks_missing": [2], "culprit_ranks": [2]}
    assert f["call_sites"]["0"] == "train.py:57" and isinstance(f["detail"], str) and f["detail"]
    assert isinstance(f["stacks"], dict)


def test_output_file_gets_the_verdict_and_stderr_one_line(tmp_path):
    _missing_rank_job(tmp_path / "d")
    code, out, err = run_cli("diagnose", str(tmp_path / "d"), "-o", str(tmp_path / "verdict.json"))
    assert code == 1 and out == "" and err == f"comm2perfetto diagnose: stuck; wrote {tmp_path / 'verdict.json'}\n"
    assert json.loads((tmp_path / "verdict.json").read_text())["status"] == "stuck"
    code, _, _ = run_cli("diagnose", str(tmp_path / "d"), "-o", str(tmp_path / "verdict.txt"))
    assert (tmp_path / "verdict.txt").read_text().startswith("STUCK: 1 finding")
    code, _, err = run_cli("diagnose", str(tmp_path / "d"), "-o", str(tmp_path / "nope" / "v.json"))
    assert code == 2 and "does not exist" in err


def test_text_puts_the_verdict_first(tmp_path):
    _missing_rank_job(tmp_path)
    code, out, _ = run_cli("diagnose", str(tmp_path))
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == "STUCK: 1 finding (world size 4, data from ranks 0-3)"
    assert lines[2] == "[1] missing_ranks on default_pg: all_reduce #4"
    assert lines[3] == ("    culprit: 2 (Flight Recorder records every collective a rank issues, and shows no #4 on "
                        "rank 2)")
    assert any(line.strip().startswith("-> ") for line in lines)


def test_pg_filter(tmp_path):
    job = FrJob(world=2)
    job.group("1", [0, 1], desc="tp")
    for r in job.ranks:
        job.collective(r, "all_reduce", [[4]] if r == 0 else [[5]])
        job.collective(r, "broadcast", [[2]], pg="1")
    job.write(tmp_path)
    assert run_cli("diagnose", str(tmp_path), "--pg", "tp")[0] == 0
    assert run_cli("diagnose", str(tmp_path), "--pg", "0")[0] == 1
    code, _, err = run_cli("diagnose", str(tmp_path), "--pg", "pp")
    assert code == 2 and "no process group named 'pp'" in err and "default_pg" in err


def test_input_errors_exit_2_with_one_line(tmp_path):
    code, out, err = run_cli("diagnose", str(tmp_path / "nope"))
    assert (code, out) == (2, "") and err.count("\n") == 1 and "no such file or folder" in err
    (tmp_path / "junk.txt").write_text("hello")
    code, _, err = run_cli("diagnose", str(tmp_path))
    assert code == 2 and "junk.txt" in err and err.count("\n") == 1


def test_mixed_jobs_are_refused_unless_forced(tmp_path):
    steady_job(world=2, steps=2).write(tmp_path / "a")
    steady_job(world=3, steps=2).write(tmp_path / "b", ranks=[2])
    code, _, err = run_cli("diagnose", str(tmp_path))
    assert code == 2 and "--force" in err
    code, out, _ = run_cli("diagnose", str(tmp_path), "--force")
    assert code in (0, 1) and "--force" in out


def test_skipped_files_are_listed(tmp_path):
    steady_job(world=2, steps=2).write(tmp_path)
    data = (tmp_path / "nccl_trace_rank_1").read_bytes()
    (tmp_path / "nccl_trace_rank_1").write_bytes(data[:100])
    code, out, _ = run_cli("diagnose", str(tmp_path))
    assert code == 1  # rank 1's data is gone: incomplete
    assert "Skipped 1 file(s):" in out and "nccl_trace_rank_1: corrupt or truncated pickle" in out


BLOCK_TORCH = textwrap.dedent("""
    import sys

    class NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError("torch is blocked in this test")
            return None

    sys.meta_path.insert(0, NoTorch())
    from comm2perfetto.cli import main
    code = main(["diagnose", sys.argv[1], "--format", "json"])
    assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules), "torch was imported"
    sys.exit(code)
""")


def test_load_and_diagnose_never_import_torch(tmp_path):
    job = FrJob(world=2, backend="gloo")
    for r in job.ranks:
        job.collective(r, "all_reduce", [[4]], state="scheduled")
    job.collective(0, "all_reduce", [[4]], state="scheduled")
    job.write(tmp_path / "dumps", prefix="rank", fmt="pickle")
    proc = subprocess.run([sys.executable, "-c", BLOCK_TORCH, str(tmp_path / "dumps")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["findings"][0]["culprit_ranks"] == [1]
