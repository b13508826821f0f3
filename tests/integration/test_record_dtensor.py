"""Tensor parallelism with DTensor (examples/tp_dtensor.py), 2 ranks, gloo, recorded by ``comm2perfetto record``.

DTensor issues its collectives through ``torch.distributed._functional_collectives``. Each recorded call must
be attributed to the module and pass torch's CommDebugMode gives it (the example saves CommDebugMode's counts),
carry Flight Recorder's sequence number of the same collective, and leave ``diagnose`` nothing to report.
"""

from __future__ import annotations

import json
import pickle
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from support.cli import run_cli_process
from support.jobs import communicate, job_env, record_cmd, torchrun
from support.torch_features import needs_gloo_flight_recorder

pytestmark = pytest.mark.integration
# The example counts with CommDebugMode per module (torch.distributed.tensor.debug, from torch 2.5 on).
pytest.importorskip("torch.distributed.tensor.debug", reason="CommDebugMode counts per module from torch 2.5 on")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tp_dtensor.py"
STEPS = 2


def _record(root: Path, *record_args: str) -> Path:
    out = root / "out"
    command = record_cmd(out, [*torchrun(2, str(EXAMPLE)), "--steps", str(STEPS), "--comm-counts",
                               str(root / "counts.json")], record_args)
    proc = subprocess.Popen(command, cwd=root, env=job_env(), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    stdout, stderr = communicate(proc, 120)
    assert proc.returncode == 0, f"{stdout}\n{stderr}"
    return out


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    return _record(tmp_path_factory.mktemp("tp"))


def _log(out: Path, rank: int):
    from comm2perfetto.sources.event_log import read_event_log

    log = read_event_log(out / f"rank{rank}.events.jsonl")
    assert log.problems == []
    return log


def leaf_counts(comm_module_counts: dict) -> Counter:
    """CommDebugMode adds each collective to its module, every parent and "Global": take the parents' share
    off, leaving each collective with the module it was issued in. Keys: (module path or None, pass, op)."""
    leaves: Counter = Counter()
    for module, passes in comm_module_counts.items():
        children = [m for m in comm_module_counts if m != module and
                    (m.rsplit(".", 1)[0] == module if "." in m else module == "Global")]
        for pass_, ops in passes.items():
            for op, count in ops.items():
                own = count - sum(comm_module_counts[c].get(pass_, {}).get(op, 0) for c in children)
                if own:
                    leaves[(None if module == "Global" else module, pass_, op)] = own
    return leaves


@pytest.mark.parametrize("rank", [0, 1])
def test_module_and_pass_agree_with_comm_debug_mode(recorded, rank):
    expected = leaf_counts(json.loads((recorded.parent / "counts.json").read_text()))
    # TP's two all-reduces per step: RowwiseParallel's output in net2's forward, the input's gradient in
    # net1's backward.
    assert expected == Counter({("MLPModule.net2", "forward", "c10d_functional.all_reduce"): STEPS,
                                ("MLPModule.net1", "backward", "c10d_functional.all_reduce"): STEPS})
    calls = _log(recorded, rank).calls
    functional = [c for c in calls if c.functional]
    assert Counter((c.module, c.pass_, f"c10d_functional.{c.op}") for c in functional) == expected
    # Everything else is parallelize_module distributing the parameters, before CommDebugMode ran.
    assert {(c.op, c.module, c.functional) for c in calls if c not in functional} == {
        ("scatter", None, False), ("broadcast", None, False)}
    for c in functional:
        # on CPU tensors, the wait on its output (which blocks until the work is done) says when it was done
        assert c.is_async and c.t_done_ns is not None and c.t_done_ns >= c.t_return_ns >= c.t_call_ns
        assert (c.shapes, c.dtypes, c.nbytes) == ([[4, 16]], ["Float"], 4 * 16 * 4)


def test_every_call_is_timed(recorded):
    """init_device_mesh("cpu") makes a group whose backend c10d calls ``undefined``, run by gloo: its
    synchronous calls (parallelize_module's scatter and broadcast) are complete when they return, and the
    functional all-reduces when the wait on them returns. Every collective has a duration in the report."""
    log = _log(recorded, 0)
    group = log.groups[0]
    assert (group.backend, group.devices) == ("undefined", {"cpu": "gloo"})
    for rank in (0, 1):
        for call in _log(recorded, rank).calls:
            assert group.completes_on_return(call) != call.functional, call
    proc = run_cli_process("report", str(recorded), "--format", "json", timeout=60)
    assert proc.code == 0, proc.err
    rows = {r["op"]: r for r in json.loads(proc.out)["collectives"]}
    # per rank: 2 functional all-reduces a step, 3 scatters and 1 broadcast from parallelize_module
    assert {op: (r["count"], r["timed"]) for op, r in rows.items()} == {
        "all_reduce": (2 * STEPS, 2 * STEPS), "scatter": (3, 3), "broadcast": (1, 1)}
    assert all(r["total_s"] > 0 for r in rows.values())


@needs_gloo_flight_recorder()
def test_functional_calls_join_flight_recorder_by_sequence_number(recorded):
    for rank in (0, 1):
        log = _log(recorded, rank)
        fr = {}
        for path in recorded.glob(f"rank{rank}.fr.*.pkl"):
            with open(path, "rb") as f:  # our own job's dump: a plain pickle.load is fine here
                fr.update({(e["process_group"][0], e["collective_seq_id"]): e for e in pickle.load(f)["entries"]})
        functional = [c for c in log.calls if c.functional]
        assert len(functional) == 2 * STEPS
        for call in functional:
            entry = fr[(log.groups[call.gid].name, call.seq)]
            assert call.seq_last == call.seq
            assert entry["profiling_name"] == "gloo:all_reduce"
            assert entry["input_sizes"] == call.shapes


def test_diagnose_finds_nothing_wrong(recorded):
    proc = run_cli_process("diagnose", str(recorded), "--format", "json", timeout=60)
    doc = json.loads(proc.out)
    assert (proc.code, doc["status"], doc["findings"], doc["ranks_with_data"]) == (0, "ok", [], [0, 1])


def test_no_modules_records_the_calls_without_modules(tmp_path):
    out = _record(tmp_path, "--no-modules")
    functional = [c for c in _log(out, 0).calls if c.functional]
    assert Counter((c.op, c.module, c.pass_) for c in functional) == Counter(
        {("all_reduce", None, None): STEPS, ("all_reduce", None, "backward"): STEPS})


def test_report_modules_match_comm_debug_mode(recorded):
    """``comm2perfetto report``'s per-module table, across both ranks, counts what CommDebugMode counted."""
    proc = run_cli_process("report", str(recorded), "--format", "json", timeout=60)
    assert proc.code == 0, proc.err
    rows = json.loads(proc.out)["modules"]
    expected = leaf_counts(json.loads((recorded.parent / "counts.json").read_text()))
    functional = Counter({(r["path"], r["pass"], f"c10d_functional.{r['op']}"): r["count"] for r in rows
                          if r["path"].startswith("MLPModule")})
    assert functional == expected
    assert all(r["ranks"] == 2 for r in rows if r["path"].startswith("MLPModule"))
    # parallelize_module's own scatter and broadcast, issued outside any module before training
    assert {(r["path"], r["op"]) for r in rows if not r["path"].startswith("MLPModule")} == {
        ("(outside any module)", "scatter"), ("(outside any module)", "broadcast")}
