"""Flight Recorder's environment: a large enough ring, dumps pointed at the output folder."""

from __future__ import annotations

import os

import pytest

from comm2perfetto.record.flight import prepare_environment, ring_in_effect


def test_sets_the_buffer_and_dump_place_when_the_user_did_not(tmp_path):
    env: dict[str, str] = {}
    assert prepare_environment(env, 20000, str(tmp_path)) == []
    assert env == {"TORCH_FR_BUFFER_SIZE": "20000",
                   "TORCH_FR_DUMP_TEMP_FILE": os.path.join(str(tmp_path), "torch_fr_rank_"),
                   # torch's own dump at an NCCL timeout (off by default before 2.6), into the folder
                   "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                   # CUDA-event timing of NCCL collectives: Flight Recorder's duration_ms
                   "TORCH_NCCL_ENABLE_TIMING": "1"}


def test_keeps_the_users_nccl_settings_and_can_leave_timing_off(tmp_path):
    env = {"TORCH_NCCL_ENABLE_TIMING": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}
    prepare_environment(env, 20000, str(tmp_path))
    assert (env["TORCH_NCCL_ENABLE_TIMING"], env["TORCH_NCCL_DUMP_ON_TIMEOUT"]) == ("0", "0")
    env = {}
    prepare_environment(env, 20000, str(tmp_path), gpu_timing=False)
    assert "TORCH_NCCL_ENABLE_TIMING" not in env


@pytest.mark.parametrize("env, ring", [
    ({"TORCH_FR_BUFFER_SIZE": "5000"}, 5000), ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "300"}, 300),
    ({"TORCH_FR_BUFFER_SIZE": "many"}, 0), ({}, 2000),  # torch 2.13's own default
])
def test_after_the_first_group_the_ring_in_effect_is_said_and_left_alone(tmp_path, env, ring):
    """Flight Recorder reads its size once, when its singleton is made at the first process group
    (torch/csrc/distributed/c10d/FlightRecorder.hpp, ``FlightRecorder::get``): enable() after
    init_process_group cannot change it, and must not claim to."""
    before = dict(env)
    warnings = prepare_environment(env, 20000, str(tmp_path), group_exists=True)
    assert ring_in_effect(env) == ring
    assert {k: env.get(k) for k in before} == before  # the buffer variables are untouched
    (warning,) = warnings
    assert f"Flight Recorder's ring holds {ring} entries" in warning and "raising" not in warning
    assert ("Flight Recorder is off" in warning) == (ring == 0)


def test_after_the_first_group_a_large_enough_ring_needs_no_warning(tmp_path):
    assert prepare_environment({"TORCH_FR_BUFFER_SIZE": "50000"}, 20000, str(tmp_path), group_exists=True) == []


def test_keeps_a_larger_user_buffer(tmp_path):
    env = {"TORCH_FR_BUFFER_SIZE": "50000"}
    assert prepare_environment(env, 20000, str(tmp_path)) == []
    assert env["TORCH_FR_BUFFER_SIZE"] == "50000"


def test_keeps_a_larger_user_buffer_given_by_its_nccl_name(tmp_path):
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "40000"}
    assert prepare_environment(env, 20000, str(tmp_path)) == []
    # Both names then agree, whichever one this torch reads.
    assert env["TORCH_FR_BUFFER_SIZE"] == env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "40000"


def test_raises_a_smaller_user_buffer_with_a_warning(tmp_path):
    env = {"TORCH_FR_BUFFER_SIZE": "100"}
    warnings = prepare_environment(env, 20000, str(tmp_path))
    assert env["TORCH_FR_BUFFER_SIZE"] == "20000"
    assert warnings == [("raising the Flight Recorder buffer from 100 to 20000 entries (TORCH_FR_BUFFER_SIZE) "
                         "so that no entry is dropped between dumps")]


def test_an_unreadable_user_buffer_is_replaced_with_a_warning(tmp_path):
    env = {"TORCH_FR_BUFFER_SIZE": "lots"}
    (warning,) = prepare_environment(env, 20000, str(tmp_path))
    assert "from lots to 20000" in warning
    assert env["TORCH_FR_BUFFER_SIZE"] == "20000"


def test_keeps_the_users_dump_place(tmp_path):
    env = {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/scratch/fr_"}
    prepare_environment(env, 20000, str(tmp_path))
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/scratch/fr_"
    assert "TORCH_FR_DUMP_TEMP_FILE" not in env


class _Clock:
    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


def _dumps_checked_at_steps(buffer_size: int, step_ns: int, steps: int) -> int:
    """How many of ``steps`` step boundaries, ``step_ns`` apart, check whether a dump is due."""
    from comm2perfetto.record.flight import FlightRecorderDumps

    dumps = FlightRecorderDumps(recorder=None, out_dir=".", buffer_size=buffer_size)
    dumps._clock = clock = _Clock()
    checks = []
    dumps.maybe_dump = lambda: checks.append(clock.ns)
    for step in range(steps):
        clock.ns = step * step_ns
        dumps.at_step(step)
    return len(checks)


def test_step_boundaries_check_at_most_once_per_half_ring_of_microseconds():
    # The default ring: 10,000 entries cannot accumulate in 10 ms. 1 ms steps check every tenth step.
    assert _dumps_checked_at_steps(20000, 1_000_000, 100) == 10
    assert _dumps_checked_at_steps(20000, 20_000_000, 10) == 10  # slow steps: every one
    # A 16-entry ring: 8 us, so every step of a real job.
    assert _dumps_checked_at_steps(16, 1_000_000, 50) == 50


GUARD_CHECK = """
import sys, threading
import torch
from comm2perfetto.record.flight import no_inductor_import_on_this_thread

lazy = torch.__getattr__
assert "torch._inductor" not in sys.modules
seen = {}
with no_inductor_import_on_this_thread():
    seen["dumping thread"] = hasattr(torch, "_inductor")
    other = threading.Thread(target=lambda: seen.__setitem__("other thread", type(torch._inductor).__name__))
    other.start()
    other.join()
print(seen, torch.__getattr__ is lazy, "_inductor" in vars(torch))
"""


def test_only_the_dumping_thread_is_kept_from_importing_inductor():
    """Torch's symboliser asks ``hasattr(torch, "_inductor")``: the dumping thread gets False without an import;
    another thread meanwhile imports inductor exactly as without the recorder; torch is left as it was."""
    import subprocess
    import sys

    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "-c", GUARD_CHECK], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["{'dumping", "thread':", "False,", "'other", "thread':", "'module'}", "True",
                                   "True"]


@pytest.mark.parametrize("version", ["2.4.1", "2.7.1+cu126", "1.13.1"])
def test_torch_without_a_gloo_flight_recorder_is_refused_in_one_line(version):
    from comm2perfetto.record.flight import unsupported_torch

    reason = unsupported_torch(version)
    assert reason is not None and "\n" not in reason
    assert reason.startswith(f"comm2perfetto record needs torch >= 2.8, found {version}: ")


@pytest.mark.parametrize("version", ["2.8.0", "2.13.0+cpu", "2.10.0+cu128", "2.14.0a0+git1234", "", "nightly"])
def test_torch_from_2_8_or_unreadable_is_recorded(version):
    from comm2perfetto.record.flight import unsupported_torch

    assert unsupported_torch(version) is None


def test_record_refuses_an_older_torch_before_starting_the_job(tmp_path, monkeypatch, capsys):
    from comm2perfetto.cli import main
    from comm2perfetto.record import flight

    monkeypatch.setattr(flight, "_installed_torch", lambda: "2.6.0+cu124")
    marker = tmp_path / "job-ran"
    assert main(["record", "-o", str(tmp_path / "out"), "--", "touch", str(marker)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs torch >= 2.8, found 2.6.0+cu124" in err
    assert not marker.exists()


@pytest.mark.parametrize(("version", "off"), [("2.8.0+cu128", True), ("2.10.0", True), ("2.11.0", False),
                                              ("2.13.0+cpu", False), ("unknown", False)])
def test_which_torch_needs_the_buffer_size_before_the_first_group(version, off):
    from comm2perfetto.record.flight import flight_recorder_off_by_default

    assert flight_recorder_off_by_default(version) is off
