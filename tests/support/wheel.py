"""The package as ``pip install .`` builds it: a wheel made from a copy of the checkout (building in the tree
would leave build/ there), and that wheel installed into a folder of its own."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pip(*argv: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *argv], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def build_wheel(folder: Path) -> Path:
    """The checkout's wheel, built without the network into ``folder``/dist."""
    source = folder / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(folder / "dist"), str(source))
    (wheel,) = (folder / "dist").glob("comm2perfetto-*.whl")
    return wheel


def install_wheel(wheel: Path, target: Path) -> Path:
    """``wheel`` installed (without its dependencies: this interpreter has them) into ``target``, the folder to
    put first on ``PYTHONPATH``."""
    _pip("install", "--no-deps", "--no-index", "-q", "--target", str(target), str(wheel))
    return target
