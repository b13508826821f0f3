"""The report document (see :mod:`comm2perfetto.report.document`) as text for a terminal.

Takes the plain dict and nothing else. Sections, in order: a header (rank count, basis, steps, where the data
came from) and the job summary line; the per-rank table (with a job row of means; over
:data:`MAX_RANKS_SHOWN` ranks, only the :data:`RANKS_EACH_END` worst and best by exposed communication); the
per-step table (the middle elided past :data:`MAX_STEPS_SHOWN` steps); collectives; the all-to-all matrices
(bytes per sender and receiver); stragglers; the module
tree; notes. Times, sizes and rank lists are worded as in every view (:mod:`comm2perfetto.words`:
``12.3 ms``, ``2.00 KiB``, ``ranks 0-3, 5``), bandwidth in GB/s with 3 significant digits, and a missing value
prints as ``-``. Same dict, same text; no trailing whitespace.

The small formatters (:func:`fmt_time`, :func:`fmt_bytes` ...) are shared with the HTML and chart writers.

Example::

    doc = {"version": 1, "basis": "gpu",
           "job": {"span_s": 1.2, "compute_s": 0.9, "comm_s": 0.3, "overlapped_comm_s": 0.2,
                   "exposed_comm_s": 0.1, "idle_s": 0.05, "comm_to_compute": 0.333, "overlap_pct": 66.7,
                   "ranks": 1},
           "ranks": {"0": {"span_s": 1.2, ..., "basis": "gpu", "sources": ["kineto gpu kernels"]}},
           "steps": [], "collectives": [], "stragglers": [], "modules": [],
           "lateness_map": {"ranks": [], "collectives": [], "lateness_s": []}, "notes": []}
    print(render_text(doc))
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from comm2perfetto.report_doc import (
    CollectiveRow,
    ExchangeRow,
    FigureKey,
    Figures,
    LiveWindows,
    ModuleRow,
    RankFigures,
    ReportDoc,
)
from comm2perfetto.words import (
    UNCALIBRATED_LEGEND,
    document_clock_text,
    duration,
    rank_mark,
    ranks_text,
    size,
    three_digits,
)

__all__ = ["MISSING", "TIME_COLUMNS", "exchange_notes", "exchange_title", "fmt_bytes", "fmt_int", "fmt_number",
           "fmt_pct", "fmt_ratio", "fmt_time", "rank_sort_key", "render_text", "table", "time_cells"]

MISSING = "-"
MAX_RANKS_SHOWN = 32
RANKS_EACH_END = 8
MAX_STEPS_SHOWN = 12
STEPS_EACH_END = 5
MAX_COLLECTIVES_SHOWN = 30
MAX_STRAGGLERS_SHOWN = 10
MAX_MATRIX_SHOWN = 16  # ranks of an all-to-all matrix drawn in full; past it, each rank's totals
PASS_LABELS: dict[str | None, str] = {"forward": "FORWARD PASS", "backward": "BACKWARD PASS",
                                      None: "OUTSIDE FORWARD AND BACKWARD"}

Doc = ReportDoc
Row = Sequence[str] | str  # a str is a line of its own inside a table (an elision mark)


# --- formatters ---------------------------------------------------------------------------------------------


def fmt_time(seconds: float | None) -> str:
    """A time of the document (seconds) as every view words it (:func:`words.duration`): ``"1.23 s"``,
    ``"12.3 ms"``, ``"456 us"``, ``"0 s"``; ``"-"`` if unknown."""
    return MISSING if seconds is None else duration(seconds * 1e9)


def fmt_bytes(n: int | float | None) -> str:
    """A size as every view words it (:func:`words.size`, binary multiples): ``"512 B"``, ``"2.00 KiB"``,
    ``"1.50 GiB"``; ``"-"`` if unknown."""
    return MISSING if n is None else size(n)


def fmt_number(x: float | None) -> str:
    """3 significant digits for small numbers, whole numbers from 1000 up (GB/s, ratios)."""
    if x is None:
        return MISSING
    return ("-" if x < 0 else "") + three_digits(abs(x))


def fmt_ratio(x: float | None) -> str:
    return MISSING if x is None else f"{x:.2f}"


def fmt_pct(x: float | None) -> str:
    return MISSING if x is None else f"{x:.1f}%"


def fmt_int(x: int | None) -> str:
    return MISSING if x is None else str(x)


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()


def rank_sort_key(rank: str | int) -> tuple[int, int | str]:
    """Ranks are dict keys (strings) in the document: sort "10" after "9"."""
    text = str(rank)
    return (0, int(text)) if _is_int(text) else (1, text)


# --- tables -------------------------------------------------------------------------------------------------


def table(header: Sequence[str], rows: Sequence[Row], aligns: str) -> list[str]:
    """Aligned columns, two spaces apart; ``aligns`` has one ``<`` or ``>`` per column. Nothing is cut to fit a
    width (a cut name names nothing: "defaul.."): a wide table's lines run long."""
    cells = [list(r) for r in rows if not isinstance(r, str)]
    widths = [max(len(c[i]) for c in [list(header), *cells]) for i in range(len(header))]

    def line(values: Sequence[str]) -> str:
        padded = (v.ljust(w) if a == "<" else v.rjust(w) for v, w, a in zip(values, widths, aligns))
        return "  ".join(padded).rstrip()

    return [line(header)] + [r if isinstance(r, str) else line(r) for r in rows]


# --- sections -----------------------------------------------------------------------------------------------

TIME_COLUMNS: tuple[tuple[str, FigureKey, Callable[[float | None], str]], ...] = (
    ("span", "span_s", fmt_time),
    ("compute", "compute_s", fmt_time),
    ("comm", "comm_s", fmt_time),
    ("overlapped", "overlapped_comm_s", fmt_time),
    ("exposed", "exposed_comm_s", fmt_time),
    ("idle", "idle_s", fmt_time),
    ("comm/compute", "comm_to_compute", fmt_ratio),
    ("overlap", "overlap_pct", fmt_pct),
)


def time_cells(values: Figures) -> list[str]:
    """A breakdown's figures as :data:`TIME_COLUMNS`' cells."""
    return [fmt(values.get(key)) for _, key, fmt in TIME_COLUMNS]


def _header(doc: Doc) -> list[str]:
    ranks = doc["ranks"]
    job = doc["job"]
    count = job.get("ranks", len(ranks))
    world = doc["world_size"]
    of = f" of {world}" if isinstance(world, int) and world > count else ""
    sampled = f" (a sample: {doc['sampled']} of {ranks_text(ranks)})" if doc["sampled"] else ""
    head = (f"comm2perfetto report: {count}{of} rank{'s' if count != 1 or of else ''}{sampled}, "
            f"basis {doc['basis'] or MISSING}")
    head += f", {scope_text(doc)}"
    lines = [head]
    by_sources: dict[tuple[str, ...], list[str]] = {}
    for rank in sorted(ranks, key=rank_sort_key):
        by_sources.setdefault(tuple(ranks[rank]["sources"]), []).append(rank)
    for sources, members in sorted(by_sources.items(), key=lambda kv: rank_sort_key(kv[1][0])):
        lines.append(f"  data: {', '.join(sources) or 'none'} ({ranks_text(members)})")
    clock = document_clock_text(doc["clock"])
    if clock:
        lines.append("  " + clock)
    lines.append(
        f"job: span {fmt_time(job['span_s'])}, comm/compute {fmt_ratio(job['comm_to_compute'])}, "
        f"overlap {fmt_pct(job['overlap_pct'])}, exposed comm {fmt_time(job['exposed_comm_s'])}"
        " (times: mean per rank)")
    return lines


def scope_text(doc: Doc) -> str:
    """What every table covers: ``steps 2-4`` (``--steps``), or ``the whole run`` and the steps it recorded
    (``the whole run (3 steps: 2-4)``): a steps table alone never narrows the others."""
    scope = doc.get("scope")
    if scope:
        first, last = scope
        return f"steps {first}-{last}" if last > first else f"step {first}"
    steps = [s["step"] for s in doc["steps"]]
    numbered = [s for s in steps if isinstance(s, int)]
    if not numbered:
        return "the whole run"
    return f"the whole run ({len(steps)} step{'s' if len(steps) != 1 else ''}: {min(numbered)}-{max(numbered)})"


def _select_ranks(ranks: Mapping[str, RankFigures]) -> tuple[list[str], list[str], list[str]]:
    """(ranks to show in order, those left out, those without an exposed-comm value)."""
    ordered = sorted(ranks, key=rank_sort_key)
    if len(ordered) <= MAX_RANKS_SHOWN:
        return ordered, [], []
    unknown = [r for r in ordered if ranks[r]["exposed_comm_s"] is None]
    known = sorted((r for r in ordered if r not in set(unknown)),
                   key=lambda r: (-(ranks[r]["exposed_comm_s"] or 0.0), rank_sort_key(r)))
    if len(known) <= 2 * RANKS_EACH_END:
        return known, [], unknown
    return known[:RANKS_EACH_END] + known[-RANKS_EACH_END:], known[RANKS_EACH_END:-RANKS_EACH_END], unknown


def _ranks_section(doc: Doc) -> list[str]:
    ranks = doc["ranks"]
    if not ranks:
        return ["ranks: none"]
    shown, hidden, unknown = _select_ranks(ranks)
    mixed = len({ranks[r]["basis"] for r in ranks}) > 1
    title = "ranks (union of each kind's intervals; overlapped = comm during compute, exposed = comm alone)"
    if hidden:
        title = (f"ranks: the {RANKS_EACH_END} with the most exposed comm and the {RANKS_EACH_END} with the least,"
                 f" of {len(ranks)}, by exposed comm")
    header = ["rank", *(["basis"] if mixed else []), *(h for h, _, _ in TIME_COLUMNS)]
    rows: list[Row] = []
    for r in shown:
        rows.append([r, *([ranks[r]["basis"] or MISSING] if mixed else []), *time_cells(ranks[r])])
        if hidden and r == shown[RANKS_EACH_END - 1]:
            rows.append(f"  ... {len(hidden)} ranks in between")
    rows.append(["job", *([doc["basis"] or MISSING] if mixed else []), *time_cells(doc["job"])])
    aligns = ">" + ("<" if mixed else "") + ">" * len(TIME_COLUMNS)
    lines = [title, *table(header, rows, aligns)]
    if unknown:
        lines.append(f"  no values for {ranks_text(unknown)}")
    return lines


def _steps_section(doc: Doc) -> list[str]:
    steps = doc["steps"]
    if not steps:
        return []
    rows: list[Row] = [[fmt_int(s["step"]), *time_cells(s["job"])] for s in steps]
    if len(rows) > MAX_STEPS_SHOWN:
        hidden = len(rows) - 2 * STEPS_EACH_END
        rows = [*rows[:STEPS_EACH_END], f"  ... {hidden} steps in between", *rows[-STEPS_EACH_END:]]
    header = ["step", *(h for h, _, _ in TIME_COLUMNS)]
    return ["steps (job values: times are means over ranks)",
            *table(header, rows, ">" * len(header))]


def _count_cell(c: CollectiveRow) -> str:
    count, timed = c["count"], c["timed"]
    return fmt_int(count) if timed is None or timed == count else f"{fmt_int(timed)}/{fmt_int(count)}"


def _collectives_section(doc: Doc) -> list[str]:
    collectives = doc["collectives"]
    if not collectives:
        return ["collectives: none"]
    queued = any(c["queue_mean_s"] is not None for c in collectives)  # only where a trace shows kernels
    header = ["op", "group", "n", "count", "bytes", "total", "mean", "p50", "p99", "algbw", "busbw", "skew",
              *(["queue"] if queued else [])]
    rows: list[Row] = [[
        c["op"] or MISSING, c["process_group"] or MISSING, fmt_int(c["group_size"]),
        _count_cell(c), fmt_bytes(c["bytes"]), fmt_time(c["total_s"]), fmt_time(c["mean_s"]),
        fmt_time(c["p50_s"]), fmt_time(c["p99_s"]), fmt_number(c["algbw_gbps"]),
        fmt_number(c["busbw_gbps"]), fmt_time(c["arrival_skew_mean_s"]),
        *([fmt_time(c["queue_mean_s"])] if queued else []),
    ] for c in collectives[:MAX_COLLECTIVES_SHOWN]]
    if len(collectives) > MAX_COLLECTIVES_SHOWN:
        rest = collectives[MAX_COLLECTIVES_SHOWN:]
        rest_total = sum(c["total_s"] or 0.0 for c in rest)
        rows.append(f"  ... {len(rest)} more, {fmt_time(rest_total)} in all (--format json lists every one)")
    legend = ["  n: group size; count a/b: a of b instances timed; skew: mean of (last - first arrival)",
              "  algbw = bytes / transfer time, busbw = algbw x the nccl-tests factor, both in GB/s"]
    if queued:
        legend.append("  on a GPU, times are its kernels; queue: mean of (first kernel begin - CPU enqueue)")
    return [f"collectives of {scope_text(doc).split(' (')[0]} (by total time)",
            *table(header, rows, "<<" + ">" * (len(header) - 2)),  # the group's name whole
            *legend]


def _all_to_all_section(doc: Doc) -> list[str]:
    lines: list[str] = []
    for x in doc.get("all_to_all") or []:
        lines.extend(["", *_exchange_lines(x)] if lines else _exchange_lines(x))
    return lines


def exchange_title(x: ExchangeRow) -> str:
    """``all_to_all_single on default_pg (4 ranks): 3 of 3 collectives, imbalance 1.67 (hot: rank 2)``."""
    title = (f"{x['op']} on {x['process_group']} ({len(x['ranks'])} ranks): {fmt_int(x['covered'])} of "
             f"{fmt_int(x['count'])} collectives")
    if x["imbalance"] is not None:
        title += f", imbalance {fmt_number(x['imbalance'])}"
    if x["hot_ranks"]:
        title += f" (hot: {ranks_text(x['hot_ranks'])})"
    return title


def exchange_notes(x: ExchangeRow) -> list[str]:
    """What a matrix leaves out, in the text's and the page's words."""
    notes = []
    if x["disagreeing"]:
        notes.append(f"{fmt_int(x['disagreeing'])} collective(s) left out: their ranks disagree on the split sizes "
                     "(diagnose names the pair)")
    if not x["covered"]:
        notes.append("no collective counted: the per-peer sizes are known only from the recorder's split sizes or "
                     "Flight Recorder's all_to_all lists")
    return notes


def _exchange_lines(x: ExchangeRow) -> list[str]:
    """One (op, group)'s per-peer bytes: the matrix (sender by row, receiver by column) and each rank's totals,
    or the totals alone past :data:`MAX_MATRIX_SHOWN` ranks."""
    ranks, sent = x["ranks"], x["sent_bytes"]
    full = len(ranks) <= MAX_MATRIX_SHOWN
    header = ["from \\ to" if full else "rank", *([str(r) for r in ranks] if full else []), "sent", "received",
              "time"]
    rows: list[Row] = [[str(r), *([fmt_bytes(b) for b in sent[a]] if full else []), fmt_bytes(sum(sent[a])),
                        fmt_bytes(x["received_bytes"][a]), fmt_time(x["time_s"][a])] for a, r in enumerate(ranks)]
    legend = ["  row: the sender, column: the receiver, over the collectives counted; time: each rank's own in "
              "them (nothing times a pair)", *(f"  {n}" for n in exchange_notes(x))]
    return [f"all-to-all per peer: {exchange_title(x)}",
            *table(header, rows, "<" + ">" * (len(header) - 1)), *legend]


def _stragglers_section(doc: Doc) -> list[str]:
    stragglers = doc["stragglers"]
    if not stragglers:
        return []
    header = ["rank", "matched", "last", "last %", "mean late", "p99 late"]
    rows: list[Row] = []
    for s in stragglers[:MAX_STRAGGLERS_SHOWN]:
        matched, last = s["matched"], s["last_arrivals"]
        share = 100.0 * last / matched if matched and last is not None else None
        rows.append([rank_mark(s["rank"], doc["clock"]), fmt_int(matched), fmt_int(last), fmt_pct(share),
                     fmt_time(s["mean_lateness_s"]), fmt_time(s["p99_lateness_s"])])
    title = "stragglers (last = collectives this rank arrived at last; late = arrival - earliest arrival)"
    legend = [UNCALIBRATED_LEGEND] if any(row[0].endswith("*") for row in rows) else []
    return [title, *table(header, rows, ">" * len(header)), *legend]


def live_rows(live: LiveWindows) -> tuple[list[str], list[list[str]]]:
    """The live windows' table, one row per group: its communication over the run, and its ranks late in
    more than half of the windows with a verdict (text and HTML)."""
    header = ["group", "calls", "bytes", "comm", "comm/step", "steps", "late in windows"]
    rows = []
    for g in live["groups"]:
        late = []
        for rank, verdicts, lateness in zip(g["ranks"], g["late"], g["lateness_s"]):
            known = [(v, x) for v, x in zip(verdicts, lateness) if v is not None]
            n_late = sum(1 for v, _ in known if v)
            if n_late * 2 > len(known):
                mean = sum(x for v, x in known if v and x is not None) / n_late
                late.append(f"rank {rank}: {n_late} of {len(known)} ({fmt_time(mean)})")
        rows.append([g["desc"] or g["group"], fmt_int(g["calls"]), fmt_bytes(g["bytes"]), fmt_time(g["comm_s"]),
                     fmt_time(g["comm_per_step_s"]), fmt_int(g["steps"]), "; ".join(late) or "none"])
    return header, rows


def live_event_lines(live: LiveWindows) -> list[str]:
    """One line per straggler event, its window as seconds after the first window's start."""
    first, every = (live["windows"] or [0])[0], live["every_s"] or 0
    return [f"+{(e['window'] - first + 1) * every:g} s: rank {e['rank']} "
            f"{'became' if e['event'] == 'start' else 'no longer'} a straggler of {e['group_desc'] or e['group']} "
            f"(mean lateness {fmt_time(e['mean_lateness_s'])}, last at {fmt_pct(100 * e['last_share'])} of its "
            "collectives)" for e in live["stragglers"]]


def _live_section(doc: Doc) -> list[str]:
    live = doc.get("live")
    if live is None:
        return []
    header, rows = live_rows(live)
    every = f"every {live['every_s']:g} s, " if live["every_s"] else ""
    title = f"live windows ({every}{len(live['windows'])} windows, from the recorder's logs; late: docs/live.md)"
    return [title, *table(header, rows, "<" + ">" * 5 + "<"), *live_event_lines(live)]


# --- module tree --------------------------------------------------------------------------------------------


@dataclass
class _Total:
    """What one module's subtree issued for one (pass, op)."""

    count: int = 0
    bytes: int | None = None
    ranks: int | None = None  # the most any one row names: ranks cannot be added up

    def add(self, count: int, nbytes: int | None, ranks: int | None) -> None:
        self.count += count
        if nbytes is not None:
            self.bytes = (self.bytes or 0) + nbytes
        if ranks is not None:
            self.ranks = max(self.ranks or 0, ranks)

    def text(self) -> str:
        parts = [str(self.count)]
        if self.bytes is not None:
            parts.append(fmt_bytes(self.bytes))
        if self.ranks is not None:
            parts.append(f"{self.ranks} rank{'s' if self.ranks != 1 else ''}")
        return ", ".join(parts)


@dataclass
class _Node:
    """One module: the totals of its subtree by (pass, op), and its children by name."""

    children: dict[str, _Node] = field(default_factory=dict)
    totals: dict[tuple[str | None, str], _Total] = field(default_factory=dict)


def module_tree(modules: Iterable[ModuleRow]) -> _Node:
    """The dotted paths as a tree; every row counts in its module and in all the module's ancestors."""
    root = _Node()
    for m in modules:
        key = (m["pass"], m["op"] or MISSING)
        node = root
        for part in (m["path"] or "(no module)").split("."):
            node = node.children.setdefault(part, _Node())
            node.totals.setdefault(key, _Total()).add(m["count"], m["bytes"], m["ranks"])
    return root


def _pass_order(p: str | None) -> tuple[int, str]:
    """Forward, backward, then any other pass by name, then none."""
    order = {"forward": (0, ""), "backward": (1, ""), None: (3, "")}
    return order.get(p, (2, str(p)))


def _pass_lines(node: _Node, pad: str) -> list[str]:
    """The node's collectives under a heading per pass; with no pass known at all (collectives issued from
    C++, or outside every module), the collectives alone."""
    passes = sorted({p for p, _ in node.totals}, key=_pass_order)
    lines = []
    for p in passes:
        inner = pad
        if passes != [None]:
            lines.append(pad + PASS_LABELS.get(p, f"{str(p).upper()} PASS"))
            inner = pad + "  "
        lines.extend(f"{inner}{op}: {total.text()}"
                     for (q, op), total in sorted(node.totals.items(), key=lambda kv: kv[0][1]) if q == p)
    return lines


def _tree_lines(node: _Node, depth: int) -> list[str]:
    """The lines of ``node``'s children and everything below them."""
    lines = []
    pad = "  " * depth
    for name in sorted(node.children, key=rank_sort_key):  # layers.2 before layers.10
        child = node.children[name]
        lines.append(pad + name)
        lines.extend(_pass_lines(child, pad + "  "))
        lines.extend(_tree_lines(child, depth + 1))
    return lines


def _modules_section(doc: Doc) -> list[str]:
    modules = doc["modules"]
    if not modules:
        return []
    return ["modules (collectives issued inside each nn.Module; a parent's counts include its children's)",
            *_tree_lines(module_tree(modules), 0)]


def _notes_section(doc: Doc, width: int) -> list[str]:
    notes = doc["notes"]
    if not notes:
        return []
    lines = ["notes"]
    for note in notes:
        lines.extend(textwrap.wrap(str(note), width, initial_indent="- ", subsequent_indent="  ") or ["-"])
    return lines


def render_text(doc: Doc, *, width: int = 100) -> str:
    """The whole report as text, sections separated by blank lines, ending with a newline."""
    sections = [
        _header(doc),
        _ranks_section(doc),
        _steps_section(doc),
        _collectives_section(doc),
        _all_to_all_section(doc),
        _stragglers_section(doc),
        _live_section(doc),
        _modules_section(doc),
        _notes_section(doc, width),
    ]
    text = "\n\n".join("\n".join(line.rstrip() for line in s) for s in sections if s)
    return text + "\n"
