"""Diagnose a recording the way a user does (the CLI, JSON out) and reduce the verdict to what a case pins down."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def diagnose(*paths: Path | str, cwd: Path | None = None) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "comm2perfetto.cli", "diagnose", *map(str, paths),
                           "--format", "json"], capture_output=True, text=True, timeout=120, cwd=cwd)
    assert proc.returncode != 2 or not proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout) if proc.stdout else {"error": proc.stderr}


def verdict(doc: dict) -> tuple:
    """(status, [(kind, seq, culprits)...]): what each case pins down exactly."""
    return doc["status"], [(f["kind"], f["seq"], f["culprit_ranks"]) for f in doc["findings"]]
