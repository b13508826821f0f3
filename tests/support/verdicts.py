"""Diagnose a recording the way a user does (the CLI, JSON out) and reduce the verdict to what a case pins down."""

from __future__ import annotations

import json
from pathlib import Path

from support.cli import run_cli_process


def diagnose(*paths: Path | str, cwd: Path | None = None) -> tuple[int, dict]:
    proc = run_cli_process("diagnose", *map(str, paths), "--format", "json", timeout=120, cwd=cwd)
    assert proc.code != 2 or not proc.out, proc.err
    return proc.code, json.loads(proc.out) if proc.out else {"error": proc.err}


def verdict(doc: dict) -> tuple:
    """(status, [(kind, seq, culprits)...]): what each case pins down exactly."""
    return doc["status"], [(f["kind"], f["seq"], f["culprit_ranks"]) for f in doc["findings"]]
