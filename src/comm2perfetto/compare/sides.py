"""The two sides of a comparison: each a report document (docs/report.md) and the steps compared on it.

A side is built from whatever ``report`` reads, or from a saved ``report --format json`` (checked by
``sources.report_json``): either way compare reads only the document, so a figure is computed once, in
``report/`` (``load_side``). This module says what a side holds (ranks, world size, steps, groups) and how the
two differ.

>>> doc = {"ranks": {"0": {}, "1": {}}, "world_size": 2, "basis": "cpu", "groups": {},
...        "steps": [{"step": n} for n in range(5)]}
>>> side = Side("BASE", "run1", doc, (1, 3))
>>> side.steps, side.ranks, side.world_size
((1, 2, 3), (0, 1), 2)
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from comm2perfetto.errors import Comm2PerfettoError
from comm2perfetto.load_options import LoadOptions
from comm2perfetto.match import load_job
from comm2perfetto.report.document import ReportOptions, build, steps_text
from comm2perfetto.report_doc import SavedReport, SavedStep
from comm2perfetto.sources.report_json import ReportFormatError, TooLargeError, check_report, read_report_json


class SideError(Comm2PerfettoError):
    """One side of a comparison cannot be read: said with the side's role (``BASE: ...``)."""


@dataclass(frozen=True)
class Side:
    """One run: ``role`` is BASE or NEW, ``path`` what was read, ``doc`` its report document, ``wanted`` the
    steps asked for (A, B inclusive; None: every step), ``saved``: the document was read from a file (its
    module and straggler tables cover the steps it was saved with)."""

    role: str
    path: str
    doc: SavedReport
    wanted: tuple[int, int] | None = None
    saved: bool = False

    @cached_property
    def steps(self) -> tuple[int, ...]:
        """The step numbers compared (empty when the run has none there: its whole-run figures are)."""
        return select_steps(self.doc, self.wanted)

    def keeps(self, step: int | None) -> bool:
        """Whether a collective of this step is compared: every one without ``wanted``, else those of the
        steps asked for."""
        return self.wanted is None or (step is not None and self.wanted[0] <= step <= self.wanted[1])

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted(int(r) for r in self.doc["ranks"]))

    @property
    def world_size(self) -> int | None:
        """The job's world size as the report knows it, else one more than the highest rank seen."""
        known = self.doc["world_size"]
        if known is not None:
            return known
        ranks = set(self.ranks) | {r for g in self.doc["groups"].values() for r in g["ranks"]}
        return max(ranks) + 1 if ranks else None

    @property
    def step_rows(self) -> list[SavedStep]:
        """The report's rows of the compared steps, in step order."""
        wanted = set(self.steps)
        return [s for s in self.doc["steps"] if s["step"] in wanted]


def load_side(role: str, path: str, steps: tuple[int, int] | None, load: LoadOptions) -> Side:
    """A saved report document, checked, or the report of what ``path`` holds, read as ``load`` says."""
    file = Path(path)
    if file.is_file() and file.name.lower().endswith((".json", ".json.gz")):
        try:
            doc = read_report_json(file)
        except (OSError, TooLargeError, zlib.error, EOFError) as exc:
            raise SideError(f"cannot read {role} {file}: {getattr(exc, 'strerror', None) or exc}") from None
        except ReportFormatError as exc:
            raise SideError(f"{role} {file}: {exc}") from None
        if doc is not None:
            return Side(role, path, doc, steps, saved=True)
    try:
        built = build(load_job([path], load), ReportOptions(steps=steps))
    except Comm2PerfettoError as exc:  # name the side the error is about
        raise SideError(f"{role}: {exc}") from None
    return Side(role, path, check_report(built), steps)


def select_steps(doc: SavedReport, wanted: tuple[int, int] | None) -> tuple[int, ...]:
    """The document's step numbers, those in ``wanted`` (A, B inclusive) when given."""
    steps = sorted({s["step"] for s in doc["steps"]})
    return tuple(n for n in steps if wanted is None or wanted[0] <= n <= wanted[1])


def layout_notes(base: Side, new: Side) -> list[str]:
    """How the two runs differ in shape: world size, ranks with data, basis, steps. Empty when alike."""
    notes = []
    if base.world_size != new.world_size:
        notes.append(f"world size differs: {base.world_size or 'unknown'} in BASE, {new.world_size or 'unknown'} "
                     "in NEW; ranks and groups present in both are compared, the others are listed as new or gone")
    only_base = sorted(set(base.ranks) - set(new.ranks))
    only_new = sorted(set(new.ranks) - set(base.ranks))
    if only_base or only_new:
        parts = ([f"ranks {steps_text(only_base)} only in BASE"] if only_base else []) + (
            [f"ranks {steps_text(only_new)} only in NEW"] if only_new else [])
        notes.append("; ".join(parts) + ": per-rank figures compared for the ranks in both")
    if base.doc["basis"] != new.doc["basis"]:
        notes.append(f"the figures come from different bases: {base.doc['basis']} in BASE, "
                     f"{new.doc['basis']} in NEW (docs/report.md): their times do not compare closely")
    for side in (base, new):
        if side.saved and side.wanted is not None and len(side.steps) < len(side.doc["steps"]):
            notes.append(f"{side.role} is a saved report: its module and straggler tables cover the steps it was "
                         f"saved with, not only steps {side.wanted[0]}-{side.wanted[1]}")
    if bool(base.steps) != bool(new.steps):
        which = "BASE" if not base.steps else "NEW"
        notes.append(f"{which} has no steps in the range compared: whole-run figures are compared instead of "
                     "per-step ones, with no noise estimate")
    return notes

