"""diagnose on real jobs recorded by ``comm2perfetto record``: the three examples, CPU gloo, 2 ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.cli import run_cli_process
from support.jobs import record_example
from support.torch_features import needs_gloo_flight_recorder

pytestmark = pytest.mark.integration


def _diagnose(out: Path, *extra: str) -> tuple[int, str]:
    proc = run_cli_process("diagnose", str(out), *extra, timeout=60)
    return proc.code, proc.out + proc.err


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, example_recordings) -> dict[str, tuple[int, Path]]:
    """The session's DDP and shape-mismatch recordings, and the hang example (rank 1 away 4 s) recorded here."""
    hang = tmp_path_factory.mktemp("recorded") / "hang"
    status, _err = record_example(hang, "hang_missing_rank.py", ["--hang-seconds", "4"], ["--stall-after", "1"])
    return {**example_recordings, "hang": (status, hang)}


def test_healthy_ddp_job(recorded):
    status, out = recorded["ddp"]
    assert status == 0
    code, text = _diagnose(out, "--format", "json")
    doc = json.loads(text)
    assert (code, doc["status"], doc["findings"], doc["ranks_with_data"]) == (0, "ok", [], [0, 1])
    assert doc["clock"]["method"]["1"] in ("measured", "refined")


def test_rank_that_wandered_off_is_named_with_its_stack(recorded):
    status, out = recorded["hang"]
    assert status == 0  # the culprit came back: the job itself succeeded
    code, text = _diagnose(out, "--format", "json")
    doc = json.loads(text)
    (f,) = doc["findings"]
    # The stall resolved and the job went on: no problem left (exit 0), the late rank reported.
    assert (code, doc["status"], f["kind"], f["culprit_ranks"], f["ranks_joined"]) == (
        0, "ok", "missing_ranks", [1], [0])
    assert f["op"] == "all_reduce" and f["resolved"] is True
    assert any("load_next_shard" in line for line in f["stacks"]["1"])
    assert f["call_sites"]["0"].startswith("hang_missing_rank.py:")
    code, text = _diagnose(out)
    assert code == 0 and "culprit: 1" in text and "load_next_shard" in text
    code, _text = _diagnose(out, "--fail-on", "late")  # for a CI gate that must catch the late rank
    assert code == 1


def test_shape_mismatch_with_a_rank_killed_by_gloo(recorded):
    status, out = recorded["mismatch"]
    assert status != 0  # gloo aborted a rank: the job fails, that is the example's point
    code, text = _diagnose(out, "--format", "json")
    doc = json.loads(text)
    (f,) = doc["findings"]
    # Both ranks reach a new call site with their own size: nothing shows which side is wrong (no tie rule), and
    # the rank gloo aborted for receiving more than it expected is the mismatch's victim.
    assert (code, doc["status"], f["kind"], f["seq"], f["culprit_ranks"], f["suspect_ranks"]) == (
        1, "desync", "size_mismatch", 4, [], [0, 1])
    assert f["victim_ranks"] == [0]
    variants = {tuple(v["ranks"]): v["signature"] for v in f["evidence"]["variants"]}
    assert variants == {(0,): "all_reduce [[256]] Float", (1,): "all_reduce [[512]] Float"}


@needs_gloo_flight_recorder()
def test_the_surviving_rank_of_the_mismatch_dumped_flight_recorder(recorded):
    """The rank gloo did not abort raises, then torchrun SIGTERMs it, often while its first dump (slow: torch
    imports to symbolise frames) is being written: the signal waits for that dump instead of losing it."""
    from comm2perfetto.sources.event_log import read_event_log

    _status, out = recorded["mismatch"]
    logs = [read_event_log(out / f"rank{r}.events.jsonl") for r in (0, 1)]
    dumped = [log for log in logs if log.fr_dumps]
    assert dumped, "no rank left a Flight Recorder dump"
    for log in dumped:
        assert {reason for _t, _name, reason in log.fr_dumps} & {"exception", "signal"}
        assert all((out / name).stat().st_size > 0 for _t, name, _reason in log.fr_dumps)
