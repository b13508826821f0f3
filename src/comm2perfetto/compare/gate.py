"""The CI gate: ``--fail-on 'exposed_comm>5%,busbw<-10%'`` turns chosen changes into exit status 1.

Grammar (spaces ignored, expressions separated by commas)::

    EXPR      := [SECTION "."] METRIC (">" | "<") THRESHOLD
    SECTION   := job | rank | collective | straggler | module
    METRIC    := step_time | compute | comm | exposed_comm | idle | overlap | comm_to_compute
               | count | bytes | duration | busbw | skew | wait_caused
    THRESHOLD := [+|-] NUMBER [UNIT]
    UNIT      := %                      (of the metric's scale: BASE's step time for a time inside the step,
                                         else its own BASE value)
               | pp                     (percentage points: overlap, the only unit it takes)
               | s | ms | us | ns       (time metrics)
               | B | KB | MB | GB       (bytes, binary multiples as the report prints them)
               | GB/s                   (busbw)
               | (none)                 (a plain number: count, and comm_to_compute, which takes nothing else)

``METRIC>T`` fails the run when some line of that metric (in that section, if named) changed by more than
T with the comparison's confidence: the lower end of its interval is above T (``<``: the upper end below T),
and its verdict says it changed (``regressed`` or ``improved``: beyond the margin, ``--min-change``, too). So
a gate never fires within the run-to-run noise the margin stands for, and never on a line that reads
``unchanged``. An exact metric's change is its interval. A collective or module that is new counts as a rise
from nothing, one that is gone as a fall to nothing (a ``%`` threshold: any). A line with no interval never
fails.

>>> [str(e) for e in parse_gate("exposed_comm>5%, collective.busbw<-10%")]
['exposed_comm>5%', 'collective.busbw<-10%']
>>> parse_gate("busbw>fast")
Traceback (most recent call last):
...
comm2perfetto.compare.gate.GateError: --fail-on 'busbw>fast': 'fast' is not a threshold (a number and a unit, e.g. -10%)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from comm2perfetto.compare.verdicts import METRICS, Scale, Verdict
from comm2perfetto.errors import Comm2PerfettoError

SECTIONS = ("job", "rank", "collective", "straggler", "module")
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_BYTES = {"B": 1.0, "KB": 1024.0, "MB": 1024.0**2, "GB": 1024.0**3}
_UNITS = {"s": _TIME, "B": _BYTES, "GB/s": {"GB/s": 1.0}, "": {"": 1.0}}
_EXPR = re.compile(r"^(?:(?P<section>[a-z_]+)\.)?(?P<metric>[a-z_]+)(?P<op>[<>])(?P<threshold>.*)$")
_THRESHOLD = re.compile(r"^(?P<number>[+-]?(?:\d+\.?\d*|\.\d+))(?P<unit>%|pp|[A-Za-z/]*)$")


class GateError(Comm2PerfettoError, ValueError):
    """A malformed --fail-on expression: the message names it and says what was expected."""


@dataclass(frozen=True)
class Expression:
    """One parsed expression. ``relative``: the threshold is a fraction of the scale (``%``); else it is in
    the metric's own unit (seconds, bytes, GB/s, points or a plain number)."""

    text: str
    section: str | None
    metric: str
    above: bool  # ">"
    threshold: float
    relative: bool

    def __str__(self) -> str:
        return self.text

    def fires(self, line: Mapping[str, Any]) -> bool:
        """Whether this line trips the expression (see the module docstring)."""
        if line["metric"] != self.metric or (self.section is not None and line["section"] != self.section):
            return False
        if line["verdict"] in (Verdict.NEW, Verdict.GONE):
            return self.metric in ("count", "bytes") and self._presence(line)
        if line["verdict"] not in (Verdict.REGRESSED, Verdict.IMPROVED):
            return False  # within the margin: noise, whatever the threshold
        low, high = (line["relative_low"], line["relative_high"]) if self.relative else (line["low"], line["high"])
        if low is None or high is None:
            return False
        return low > self.threshold if self.above else high < self.threshold

    def _presence(self, line: Mapping[str, Any]) -> bool:
        value = line["new"] if line["verdict"] == Verdict.NEW else -(line["base"] or 0.0)
        if self.relative:
            return (line["verdict"] == Verdict.NEW) == self.above  # from nothing: +infinity; to nothing: -100 %
        return value > self.threshold if self.above else value < self.threshold


def parse_gate(text: str) -> list[Expression]:
    """Every expression of a --fail-on value; GateError for the first malformed one."""
    parts = [p for p in (part.replace(" ", "") for part in text.split(",")) if p]
    if not parts:
        raise GateError(f"--fail-on {text!r}: no expression (e.g. 'exposed_comm>5%,busbw<-10%')")
    return [_parse(p) for p in parts]


def _parse(text: str) -> Expression:
    where = f"--fail-on {text!r}"
    match = _EXPR.match(text)
    if match is None:
        raise GateError(f"{where}: expected METRIC>THRESHOLD or METRIC<THRESHOLD, e.g. exposed_comm>5%")
    section, name, op, threshold = match.group("section", "metric", "op", "threshold")
    if section is not None and section not in SECTIONS:
        raise GateError(f"{where}: unknown section {section!r}; sections: {', '.join(SECTIONS)}")
    metric = METRICS.get(name)
    if metric is None:
        raise GateError(f"{where}: unknown metric {name!r}; metrics: {', '.join(METRICS)}")
    number = _THRESHOLD.match(threshold)
    if number is None:
        raise GateError(f"{where}: {threshold!r} is not a threshold (a number and a unit, e.g. -10%)")
    value, unit = float(number.group("number")), number.group("unit")
    above = op == ">"
    if (above and value < 0) or (not above and value > 0):
        shown = f"{'+' if value > 0 else ''}{value:g}{unit}"
        written = f"{name}{'<' if above else '>'}{value:g}{unit}"
        raise GateError(f"{where}: '{op}' fails on any change {'above' if above else 'below'} {shown}, no change "
                        f"at all included; a {'fall' if above else 'rise'} of more than {abs(value):g}{unit} is "
                        f"written {written}")
    return Expression(text, section, name, above, *_threshold(where, metric.name, value, unit))


def _threshold(where: str, name: str, value: float, unit: str) -> tuple[float, bool]:
    """(threshold, relative) in the unit lines carry: a fraction for %, else the metric's own unit."""
    metric = METRICS[name]
    if metric.scale == Scale.ABSOLUTE:
        wanted = "pp" if metric.unit == "%" else ""
        if unit != wanted:
            example = f"{name}{'<-' if metric.worse < 0 else '>'}{'5pp' if wanted else '0.1'}"
            raise GateError(f"{where}: {name}'s change is read as it is, "
                            + ("in percentage points" if wanted else "as a plain number") + f", e.g. {example}")
        return value, False
    if unit == "%":
        return value / 100, True
    if unit == "" and value == 0:
        return 0.0, False  # nothing is nothing in any unit
    scales = _UNITS[metric.unit]
    if unit == "" and "" not in scales:
        raise GateError(f"{where}: give {name}'s threshold a unit: %, {', '.join(scales)}")
    if unit not in scales:
        allowed = ", ".join(repr(u) if u else "a plain number" for u in ("%", *scales))
        raise GateError(f"{where}: {unit!r} is not a unit of {name}; use {allowed}")
    return value * scales[unit], False


def gate_failures(expressions: Sequence[Expression], lines: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """For each expression that fires, the indexes of the lines that trip it."""
    failed = []
    for expression in expressions:
        hits = [i for i, line in enumerate(lines) if expression.fires(line)]
        if hits:
            failed.append({"expression": expression.text, "lines": hits})
    return failed

