"""What `pip install comm2perfetto` brings: the readers' needs only; torch and nvtx come with the record extra,
and the test extra (CI's install) brings that extra too. What the built wheel holds: every file of the package,
the examples `comm2perfetto demo` runs among them."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import tomllib

from comm2perfetto.cli import demo

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "comm2perfetto"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_readers_install_pulls_no_torch():
    assert _names(PROJECT["dependencies"]) == {"orjson"}


def test_record_extra_brings_torch_and_nvtx_and_the_tests_bring_it():
    extras = PROJECT["optional-dependencies"]
    assert {"torch", "nvtx"} <= _names(extras["record"])
    assert "comm2perfetto[record]" in extras["test"] and "perfetto" in _names(extras["test"])


def test_the_wheel_ships_every_module_the_examples_and_the_boot_files(built_wheel):
    """A non-editable install gets what `pip install .` builds: the wheel must hold every file of the package
    (modules, record/_boot's sitecustomize, the examples and their README), and the example `demo` runs."""
    with zipfile.ZipFile(built_wheel) as z:
        shipped = {n for n in z.namelist() if n.startswith("comm2perfetto/")}
    expected = {p.relative_to(PACKAGE.parent).as_posix() for p in PACKAGE.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts}
    assert shipped == expected
    # where `comm2perfetto demo` looks for its example, from wherever the package is installed
    assert demo.EXAMPLE.relative_to(Path(demo.__file__).resolve().parents[1]).as_posix() == "examples/ddp_train.py"
    assert {"comm2perfetto/examples/ddp_train.py", "comm2perfetto/examples/_launch.py",
            "comm2perfetto/examples/README.md", "comm2perfetto/record/_boot/sitecustomize.py"} <= shipped


def test_the_examples_folder_the_readme_names_is_the_packaged_one():
    assert (ROOT / "examples").resolve() == PACKAGE / "examples"
    assert (PACKAGE / "examples" / "__init__.py").is_file()
