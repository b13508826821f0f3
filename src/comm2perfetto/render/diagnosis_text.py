"""A diagnosis as text for a terminal: the same content as its JSON, most important first.

Takes a ``Diagnosis`` (see :mod:`comm2perfetto.diagnose.findings`) and nothing else::

    STUCK: 1 finding (world size 2, data from ranks 0, 1)
    OK: every collective matched on the ranks sampled (world size 128, traces of 2 of 128 ranks (0, 1))

    [1] missing_ranks on default_pg: all_reduce #4
        culprit: 1
        rank 1 had not issued all_reduce #4 on default_pg when the stall was detected ...
        -> Look at what rank 1 was doing instead ...
"""

from __future__ import annotations

from typing import TextIO

from comm2perfetto.diagnose.attempts import attempts_text
from comm2perfetto.diagnose.findings import Diagnosis, Finding
from comm2perfetto.words import duration, rank_list, ranks_text, sample_text

__all__ = ["render_text"]

MAX_SKIPPED_SHOWN = 5

_HEADLINE = {
    "ok": "OK: every collective matched on all ranks",
    "stuck": "STUCK",
    "desync": "DESYNC",
    "incomplete": "INCOMPLETE: the data cannot show the job healthy",
    "crashed": "CRASHED",
    "interrupted": "INTERRUPTED: no communication problem before the job was interrupted",
    "running": "RUNNING: nothing wrong so far",
}


def render_text(d: Diagnosis, out: TextIO) -> None:
    """The same content as the JSON, for a person, most important first."""
    world = f"world size {d.world_size}" if d.world_size else "world size unknown"
    n = len(d.findings)
    head = _HEADLINE[d.status]
    if d.sampled and d.status == "ok":
        head = "OK: every collective matched on the ranks sampled"
    if n and d.status == "ok":  # only stalls the job got over
        head += f"; {n} stall{'s' if n > 1 else ''} resolved"
    elif n:
        head += f": {n} finding{'s' if n > 1 else ''}"
    data = (sample_text(d.sampled, d.ranks_with_data, d.world_size) if d.sampled
            else f"data from {ranks_text(d.ranks_with_data)}")
    out.write(f"{head} ({world}, {data})\n")
    attempts = attempts_text(d.attempt, d.other_attempts)
    if attempts is not None:
        out.write("\n" + _wrap(attempts, ""))
    for i, f in enumerate(d.findings, 1):
        out.write("\n")
        _finding(i, f, out)
    if d.skipped:
        out.write(f"\nSkipped {len(d.skipped)} file(s):\n")
        for s in d.skipped[:MAX_SKIPPED_SHOWN]:
            out.write(f"  {s.path}: {s.reason}\n")
        if len(d.skipped) > MAX_SKIPPED_SHOWN:
            out.write(f"  ... and {len(d.skipped) - MAX_SKIPPED_SHOWN} more (see --format json)\n")
    for note in d.notes:
        out.write(f"\nNote: {note}\n")
    clock = d.clock
    if clock.residual_skew_ns is not None:
        out.write(f"\nClock: ranks aligned on {clock.samples} collective ends; residual skew "
                  f"{duration(clock.residual_skew_ns)}\n")


def _finding(i: int, f: Finding, out: TextIO) -> None:
    where = f" on {f.process_group}" if f.process_group else ""
    what = f" {f.op} #{f.seq}" if f.seq is not None and f.op else (f" {f.op}" if f.op else "")
    tag = " (resolved: the job went on)" if f.resolved else ""
    if f.blocked_by is not None:
        tag += f" (blocked by [{f.blocked_by}])"
    out.write(f"[{i}] {f.kind}{where}:{what}{tag}\n")
    basis = f" ({f.basis})" if f.basis else ""
    if f.culprit_ranks:
        out.write(_wrap(f"culprit: {rank_list(f.culprit_ranks)}{basis}", "    ", hang="      "))
    if f.suspect_ranks:
        why = basis if not f.culprit_ranks and basis else " (the data can neither clear nor blame it)"
        out.write(_wrap(f"suspect: {rank_list(f.suspect_ranks)}{why}", "    ", hang="      "))
    if f.victim_ranks:
        out.write(f"    victim: {rank_list(f.victim_ranks)} (failed because of it)\n")
    out.write(_wrap(f.detail, "    "))
    for rank, site in sorted(f.call_sites.items()):
        out.write(f"    call site, rank {rank}: {site}\n")
    for rank, stack in sorted(f.stacks.items()):
        out.write(f"    stack of rank {rank} (innermost first):\n")
        for line in stack:
            out.write(f"      {line}\n")
    out.write(_wrap("-> " + f.action, "    "))


def _wrap(text: str, indent: str, width: int = 110, hang: str | None = None) -> str:
    """``text`` in lines of at most ``width``, the first indented by ``indent``, the rest by ``hang``."""
    words, lines, line = text.split(), [], ""
    for w in words:
        if line and len(indent) + len(line) + 1 + len(w) > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}" if line else w
    if line:
        lines.append(line)
    rest = indent if hang is None else hang
    return "".join(f"{indent if i == 0 else rest}{ln}\n" for i, ln in enumerate(lines))
