"""The README's test command is what CI runs: .ci/run's commands from the install on, joined with ``&&``
(.ci/run's ``-q`` aside), are the README's second command::

    pip install -c constraints.txt -e ".[test]" && ruff check src tests benchmarks && mypy && python -m pytest
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _ci_commands() -> list[str]:
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("pip install"))
    return [re.sub(r" -q\b", "", line) for line in lines[start:] if line and not line.startswith("#")]


def test_the_readme_runs_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", readme, re.S)
    assert block, "README.md opens with no bash block"
    (test_command,) = [line for line in block.group(1).splitlines() if '".[test]"' in line]
    assert test_command.split(" && ") == _ci_commands()


def test_ci_checks_before_it_tests():
    commands = _ci_commands()
    assert commands[-1] == "python -m pytest"
    assert {"ruff check src tests benchmarks", "mypy"} <= set(commands[:-1])
