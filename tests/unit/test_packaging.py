"""What `pip install comm2perfetto` brings: the readers' needs only; torch and nvtx come with the record extra,
and the test extra (CI's install) brings that extra too."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

PROJECT = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_readers_install_pulls_no_torch():
    assert _names(PROJECT["dependencies"]) == {"orjson"}


def test_record_extra_brings_torch_and_nvtx_and_the_tests_bring_it():
    extras = PROJECT["optional-dependencies"]
    assert {"torch", "nvtx"} <= _names(extras["record"])
    assert "comm2perfetto[record]" in extras["test"] and "perfetto" in _names(extras["test"])
