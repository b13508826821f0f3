"""Which torch the recorder runs on, and which mechanism sees each backend's C++-issued collectives there
(record/mechanisms.py): the version gate, the dispatcher fallback's switch and the start-up line."""

from __future__ import annotations

import pytest

from comm2perfetto.record import mechanisms
from comm2perfetto.record.mechanisms import gloo_fallback_wanted, startup_line, unsupported_torch
from support.cli import run_cli


@pytest.mark.parametrize("version", ["2.3.1+cu121", "2.0.0", "1.13.1"])
def test_torch_older_than_2_4_is_refused_in_one_line(version):
    reason = unsupported_torch(version)
    assert reason is not None and "\n" not in reason
    assert reason.startswith(f"comm2perfetto record needs torch >= 2.4, found {version} ")


@pytest.mark.parametrize("version", ["2.4.1", "2.6.0+cu124", "2.7.1+cu126", "2.8.0", "2.13.0+cpu",
                                     "2.14.0a0+git1234", "", "nightly"])
def test_torch_from_2_4_or_unreadable_is_recorded(version):
    assert unsupported_torch(version) is None


def test_record_refuses_an_older_torch_before_starting_the_job(tmp_path, monkeypatch):

    monkeypatch.setattr(mechanisms, "_installed_torch", lambda: "2.3.1+cu121")
    marker = tmp_path / "job-ran"
    ran = run_cli("record", "-o", str(tmp_path / "out"), "--", "touch", str(marker))
    assert ran.code == 2
    err = ran.err
    assert err.count("\n") == 1 and "needs torch >= 2.4, found 2.3.1+cu121" in err
    assert not marker.exists()


@pytest.mark.parametrize(("version", "wanted"), [("2.4.1", True), ("2.6.0+cu124", True), ("2.7.1+cu126", True),
                                                 ("2.8.0+cu128", False), ("2.13.0+cpu", False),
                                                 ("unknown", False)])
def test_the_fallback_is_wanted_where_flight_recorder_does_not_record_gloo(version, wanted):
    assert gloo_fallback_wanted(version, {}) is wanted
    expected = "the dispatcher fallback" if wanted else "Flight Recorder"
    assert mechanisms.mechanisms(version, {}) == {"gloo": expected, "nccl": "Flight Recorder"}


@pytest.mark.parametrize("version", ["2.4.1", "2.13.0+cpu"])
def test_the_internal_switch_forces_the_fallback_either_way(version):
    assert gloo_fallback_wanted(version, {mechanisms.ENV_FALLBACK: "force"}) is True
    assert gloo_fallback_wanted(version, {mechanisms.ENV_FALLBACK: "off"}) is False


def test_the_start_up_line_names_each_backends_mechanism():
    old = startup_line("2.6.0+cu124", {})
    assert "\n" not in old and old.startswith("torch 2.6.0+cu124: C++-issued collectives (DDP, FSDP) ")
    assert "by Flight Recorder on nccl, by the dispatcher fallback on gloo (no Flight Recorder for gloo before " \
           "torch 2.8)" in old
    new = startup_line("2.13.0+cpu", {})
    assert "by Flight Recorder on gloo and nccl; others by the patch layer" in new
    forced = startup_line("2.13.0+cpu", {mechanisms.ENV_FALLBACK: "force"})
    assert f"by the dispatcher fallback on gloo ({mechanisms.ENV_FALLBACK} forces it)" in forced


def test_record_prints_the_start_up_line_before_the_job_runs(tmp_path, monkeypatch):

    monkeypatch.setattr(mechanisms, "_installed_torch", lambda: "2.4.1")
    monkeypatch.delenv(mechanisms.ENV_FALLBACK, raising=False)
    ran = run_cli("record", "-o", str(tmp_path / "out"), "--", "true")
    assert ran.code == 0
    lines = ran.err.splitlines()
    assert lines[0].startswith("comm2perfetto: recording into ")
    assert lines[1] == f"comm2perfetto: {startup_line('2.4.1', {})}"


def test_pyproject_declares_the_range_the_recorder_accepts():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    (record,) = re.findall(r"^record = \[(.*)\]$", text, re.MULTILINE)
    least = f"{mechanisms.MIN_TORCH[0]}.{mechanisms.MIN_TORCH[1]}"
    assert f'"torch>={least}"' in record
