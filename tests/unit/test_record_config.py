"""Recording settings: step ranges and the environment that carries the configuration to every rank."""

from __future__ import annotations

import pytest

from comm2perfetto.record.config import RecordConfig, parse_step_range


@pytest.mark.parametrize("text, expected", [("3-5", (3, 5)), ("4", (4, 4)), (" 0-0 ", (0, 0)), ("2-10", (2, 10))])
def test_parse_step_range(text, expected):
    assert parse_step_range(text) == expected


@pytest.mark.parametrize("text, message", [
    ("a-b", "step range 'a-b' is not of the form A-B (for example 3-5)"),
    ("1-2-3", "step range '1-2-3' is not of the form A-B (for example 3-5)"),
    ("", "step range '' is not of the form A-B (for example 3-5)"),
    ("3-", "step range '3-' is not of the form A-B (for example 3-5)"),
    ("-1", "step range '-1' is not of the form A-B (for example 3-5)"),
    ("5-3", "step range '5-3': need 0 <= A <= B"),
])
def test_parse_step_range_errors(text, message):
    with pytest.raises(ValueError) as info:
        parse_step_range(text)
    assert str(info.value) == message


def test_config_round_trips_through_the_environment(tmp_path):
    config = RecordConfig(out_dir=str(tmp_path / "out"), stall_after_s=2.5, profile_steps=(3, 4), sync=True,
                          modules=False, fr_buffer=123, run_id="run-7", live=False, gpu_timing=False,
                          live_every_s=7.5)
    env = config.to_env()
    assert RecordConfig.from_env(env) == config
    off = RecordConfig(out_dir=str(tmp_path), stall_after_s=None)
    assert off.to_env()["COMM2PERFETTO_STALL_AFTER"] == "off"
    assert RecordConfig.from_env(off.to_env()).stall_after_s is None
    assert "COMM2PERFETTO_PROFILE_STEPS" not in off.to_env()
    no_windows = RecordConfig(out_dir=str(tmp_path), live_every_s=None)
    assert no_windows.to_env()["COMM2PERFETTO_LIVE_EVERY"] == "off"
    assert RecordConfig.from_env(no_windows.to_env()).live_every_s is None
    assert RecordConfig.from_env({"COMM2PERFETTO_DIR": str(tmp_path)}).live_every_s == 60.0  # the default


def test_relative_out_dir_is_made_absolute_for_the_ranks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert RecordConfig(out_dir="out").to_env()["COMM2PERFETTO_DIR"] == str(tmp_path / "out")


def test_no_recording_without_an_output_folder():
    assert RecordConfig.from_env({}) is None
    assert RecordConfig.from_env({"COMM2PERFETTO_DIR": "", "COMM2PERFETTO_STALL_AFTER": "3"}) is None


def test_header_carries_the_settings_but_not_paths(tmp_path):
    header = RecordConfig(out_dir=str(tmp_path), stall_after_s=5.0, profile_steps=(1, 2), run_id="x").as_header()
    assert header == {"stall_after_s": 5.0, "profile_steps": (1, 2), "sync": False, "modules": True,
                      "fr_buffer": 20000, "gpu_timing": True, "live": True, "live_every_s": 60.0}
