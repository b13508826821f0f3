"""The report renderers (text, CSV, HTML/SVG, matplotlib) on hand-made documents that follow the contract."""

from __future__ import annotations

import copy
import csv
import io
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from comm2perfetto.render import report_plot
from comm2perfetto.render.report_csv import (
    COLLECTIVE_COLUMNS,
    RANK_COLUMNS,
    render_csv,
    render_csv_stdout,
    write_csv,
)
from comm2perfetto.render.report_plot import (
    NO_DATA_COLOUR,
    PlotDependencyError,
    bar_segments,
    plot_title,
    render_html,
    write_plot,
)
from comm2perfetto.render.report_text import fmt_bytes, fmt_number, fmt_time, render_text
from comm2perfetto.report_doc import FIGURES, INSTANCE_COLUMNS
from comm2perfetto.words import document_clock_text

# --- documents ----------------------------------------------------------------------------------------------

UNKNOWN = {key: None for key in FIGURES}  # a breakdown with no figure known


def times(span: float, compute: float, comm: float, overlapped: float, idle: float) -> dict[str, Any]:
    return {"span_s": span, "compute_s": compute, "comm_s": comm, "overlapped_comm_s": overlapped,
            "exposed_comm_s": comm - overlapped, "idle_s": idle, "comm_to_compute": comm / compute,
            "overlap_pct": 100.0 * overlapped / comm}


def rank_entry(compute: float, comm: float, overlapped: float, span: float = 1.2) -> dict[str, Any]:
    idle = span - compute - (comm - overlapped)
    return {**times(span, compute, comm, overlapped, idle), "basis": "gpu",
            "sources": ["kineto gpu kernels", "flight recorder"]}


def collective(**fields: Any) -> dict[str, Any]:
    """A collectives row whose per-collective samples and queue delay are not known."""
    return {"queue_mean_s": None, "group_uid": "0[0,1,2,3]", **fields,
            "instances": {key: [] for key in INSTANCE_COLUMNS}}


def make_doc(n_ranks: int = 4) -> dict[str, Any]:
    """Four ranks (rank 3 the straggler with 350 ms exposed comm), three steps, three collectives, modules."""
    shapes = [(0.9, 0.3, 0.2), (0.88, 0.32, 0.2), (0.91, 0.29, 0.22), (0.7, 0.45, 0.1)]
    ranks = {str(r): rank_entry(*shapes[r % 4]) for r in range(n_ranks)}
    step = times(0.4, 0.28, 0.11, 0.06, 0.07)
    return {
        "version": 1,
        "basis": "gpu",
        "world_size": None,
        "job": {**times(1.2, 0.8475, 0.34, 0.18, 0.1925), "ranks": n_ranks},
        "ranks": ranks,
        "steps": [{"step": s, "job": {**step, "ranks": n_ranks}, "ranks": {r: dict(step) for r in ranks}}
                  for s in (3, 4, 5)],
        "collectives": [
            collective(op="all_reduce", process_group="0 (default_pg)", group_size=4, count=300, timed=300,
                       bytes=300 * 25 * 2**20, total_s=0.31, mean_s=0.00103, p50_s=0.00098, p99_s=0.0042,
                       transfer_s=0.25, algbw_gbps=31.4, busbw_gbps=47.1, arrival_skew_mean_s=0.00021),
            collective(op="all_gather_into_tensor", process_group="1 (tp)", group_size=2, count=48, timed=40,
                       bytes=48 * 4096, total_s=0.0021, mean_s=4.4e-5, p50_s=4.0e-5, p99_s=9.1e-5,
                       transfer_s=0.0015, algbw_gbps=0.131, busbw_gbps=0.0655, arrival_skew_mean_s=1.2e-5,
                       group_uid="1[0,1]"),
            collective(op="barrier", process_group="0 (default_pg)", group_size=4, count=2, timed=2, bytes=0,
                       total_s=0.0004, mean_s=0.0002, p50_s=0.0002, p99_s=0.0002, transfer_s=0.0001,
                       algbw_gbps=None, busbw_gbps=None, arrival_skew_mean_s=None),
        ],
        "stragglers": [
            {"rank": 3, "matched": 350, "last_arrivals": 301, "mean_lateness_s": 0.0031, "p99_lateness_s": 0.012},
            {"rank": 0, "matched": 350, "last_arrivals": 20, "mean_lateness_s": 0.0002, "p99_lateness_s": 0.0009},
        ],
        "modules": [
            {"path": "MLPModule", "pass": "forward", "op": "broadcast", "count": 1, "bytes": 64, "ranks": 4},
            {"path": "MLPModule.net1", "pass": "backward", "op": "all_reduce", "count": 2, "bytes": 2048,
             "ranks": 4},
            {"path": "MLPModule.net2", "pass": "forward", "op": "all_reduce", "count": 1, "bytes": 2048,
             "ranks": 2},
            {"path": "MLPModule.net2", "pass": "backward", "op": "all_reduce", "count": 1, "bytes": 2048,
             "ranks": 4},
        ],
        "lateness_map": {
            "ranks": [0, 1, 2, 3],
            "collectives": ["all_reduce 0:1", "all_reduce 0:2", "barrier 0:3"],
            "lateness_s": [[0.0, 0.0, None], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.001, 0.004, 0.002]],
        },
        "groups": {},
        "notes": ["rank 3 has no GPU kernels in steps 1-2: its compute there comes from CPU ops, which include "
                  "kernel launch time, so its overlap is overstated a little (see https://example.com/x)"],
        "sampled": None,
        "clock": None,
    }


def many_ranks_doc(n: int) -> dict[str, Any]:
    """``n`` ranks, rank r with r ms of exposed comm."""
    doc = make_doc(1)
    doc["ranks"] = {str(r): rank_entry(0.8, 0.2 + r / 1000, 0.2) for r in range(n)}
    doc["job"]["ranks"] = n
    doc["steps"] = []
    return doc


# --- helpers ------------------------------------------------------------------------------------------------


def section(text: str, title_start: str) -> list[str]:
    """The lines of the section whose title starts with ``title_start`` (sections are blank-line separated)."""
    for block in text.split("\n\n"):
        if block.startswith(title_start):
            return block.splitlines()
    raise AssertionError(f"no section {title_start!r} in:\n{text}")


def table_rows(lines: list[str]) -> dict[str, dict[str, str]]:
    """A rendered table (title, header, rows) as {first cell: {header: cell}}; cells are 2+ spaces apart."""
    header = re.split(r"\s{2,}", lines[1].strip())
    rows = {}
    for line in lines[2:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) == len(header):
            rows[cells[0]] = dict(zip(header, cells))
    return rows


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    parent: Element | None
    children: list[Element] = field(default_factory=list)
    text: str = ""

    def all(self, tag: str | None = None, cls: str | None = None) -> list[Element]:
        found = []
        for child in self.children:
            if (tag is None or child.tag == tag) and (cls is None or cls in child.attrs.get("class", "").split()):
                found.append(child)
            found.extend(child.all(tag, cls))
        return found

    def full_text(self) -> str:
        return self.text + "".join(c.full_text() for c in self.children)


class TreeBuilder(HTMLParser):
    """A small DOM from html.parser: enough to count elements and read text and attributes."""

    VOID = frozenset({"meta", "br", "hr", "img", "link", "input", "line"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#root", {}, None)
        self.current = self.root
        self.data: list[str] = []
        self.attr_values: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs}, self.current)
        self.attr_values.extend(v or "" for _, v in attrs)
        self.current.children.append(element)
        if tag not in self.VOID:
            self.current = element

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.current.children.append(Element(tag, {k: v or "" for k, v in attrs}, self.current))
        self.attr_values.extend(v or "" for _, v in attrs)

    def handle_endtag(self, tag: str) -> None:
        node: Element | None = self.current
        while node is not None and node.tag != tag:
            node = node.parent
        assert node is not None and node.parent is not None, f"unbalanced </{tag}>"
        self.current = node.parent

    def handle_data(self, data: str) -> None:
        self.current.text += data
        self.data.append(data)


def parse_html(text: str) -> TreeBuilder:
    builder = TreeBuilder()
    builder.feed(text)
    builder.close()
    assert builder.current is builder.root, "unclosed elements"
    return builder


# --- formatters ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "-"), (0, "0 s"), (1.2, "1.20 s"), (12.345, "12.3 s"), (1234.0, "1234 s"), (0.35, "350 ms"),
    (0.07, "70.0 ms"), (0.0042, "4.20 ms"), (0.99996, "1.00 s"), (0.00098, "980 us"), (4.4e-5, "44.0 us"),
    (5e-7, "500 ns"), (-0.002, "-2.00 ms"),
])
def test_fmt_time(seconds: float | None, text: str) -> None:
    assert fmt_time(seconds) == text


@pytest.mark.parametrize(("n", "text"), [
    (None, "-"), (0, "0 B"), (512, "512 B"), (1024, "1.00 KiB"), (2048, "2.00 KiB"), (25 * 2**20, "25.0 MiB"),
    (300 * 25 * 2**20, "7.32 GiB"),
])
def test_fmt_bytes(n: int | None, text: str) -> None:
    assert fmt_bytes(n) == text


@pytest.mark.parametrize(("x", "text"), [(None, "-"), (31.4, "31.4"), (0.0655, "0.0655"), (5.12e-5, "0.0000512"),
                                         (1234.5, "1234"), (100.0, "100")])
def test_fmt_number(x: float | None, text: str) -> None:
    assert fmt_number(x) == text


# --- text ---------------------------------------------------------------------------------------------------


def test_text_header_and_job_line() -> None:
    lines = render_text(make_doc()).splitlines()
    assert lines[0] == "comm2perfetto report: 4 ranks, basis gpu, the whole run (3 steps: 3-5)"
    assert lines[1] == "  data: kineto gpu kernels, flight recorder (ranks 0-3)"
    assert lines[2] == ("job: span 1.20 s, comm/compute 0.40, overlap 52.9%, exposed comm 160 ms"
                        " (times: mean per rank)")


def test_text_rank_table() -> None:
    rows = table_rows(section(render_text(make_doc()), "ranks"))
    assert list(rows) == ["0", "1", "2", "3", "job"]
    assert rows["3"] == {"rank": "3", "span": "1.20 s", "compute": "700 ms", "comm": "450 ms", "overlapped": "100 ms",
                         "exposed": "350 ms", "idle": "150 ms", "comm/compute": "0.64", "overlap": "22.2%"}
    assert rows["2"]["exposed"] == "70.0 ms"
    assert rows["job"]["exposed"] == "160 ms"
    assert "basis" not in rows["0"]  # one basis for every rank: no column for it


def test_text_many_ranks_shows_worst_and_best() -> None:
    lines = section(render_text(many_ranks_doc(40)), "ranks")
    assert lines[0] == "ranks: the 8 with the most exposed comm and the 8 with the least, of 40, by exposed comm"
    rows = table_rows(lines)
    assert list(rows) == [str(r) for r in range(39, 31, -1)] + [str(r) for r in range(7, -1, -1)] + ["job"]
    assert rows["39"]["exposed"] == "39.0 ms"
    assert "  ... 24 ranks in between" in lines


def test_text_many_ranks_without_values_are_named() -> None:
    doc = many_ranks_doc(40)
    doc["ranks"]["17"] = {**{k: None for k in doc["ranks"]["17"]}, "basis": "cpu", "sources": []}
    lines = section(render_text(doc), "ranks")
    assert "17" not in table_rows(lines)
    assert lines[-1] == "  no values for rank 17"
    assert "basis" in lines[1]  # gpu and cpu ranks: the basis gets a column


def test_text_mixed_basis_and_32_ranks_all_shown() -> None:
    doc = many_ranks_doc(32)
    assert list(table_rows(section(render_text(doc), "ranks"))) == [str(r) for r in range(32)] + ["job"]


def test_text_steps_elide_the_middle() -> None:
    doc = make_doc()
    doc["steps"] = [{"step": s, "job": {**times(0.4, 0.28, 0.11, 0.06 + s / 1000, 0.07), "ranks": 4}, "ranks": {}}
                    for s in range(30)]
    lines = section(render_text(doc), "steps")
    rows = table_rows(lines)
    assert list(rows) == ["0", "1", "2", "3", "4", "25", "26", "27", "28", "29"]
    assert rows["29"]["overlapped"] == "89.0 ms"
    assert "  ... 20 steps in between" in lines


def test_text_collectives_table() -> None:
    lines = section(render_text(make_doc()), "collectives")
    rows = table_rows(lines)
    assert rows["all_reduce"] == {
        "op": "all_reduce", "group": "0 (default_pg)", "n": "4", "count": "300", "bytes": "7.32 GiB",
        "total": "310 ms", "mean": "1.03 ms", "p50": "980 us", "p99": "4.20 ms", "algbw": "31.4", "busbw": "47.1",
        "skew": "210 us"}
    assert rows["all_gather_into_tensor"]["count"] == "40/48"  # 40 of 48 timed
    assert rows["barrier"]["algbw"] == rows["barrier"]["skew"] == "-"
    assert [r for r in rows][:3] == ["all_reduce", "all_gather_into_tensor", "barrier"]  # the document's order


def test_every_table_says_the_scope_of_the_header() -> None:
    """Without --steps the collectives cover the whole run, not just the steps listed; with it, those steps."""
    doc = make_doc()
    assert section(render_text(doc), "collectives")[0] == "collectives of the whole run (by total time)"
    doc["scope"] = [3, 5]
    text = render_text(doc)
    assert text.splitlines()[0] == "comm2perfetto report: 4 ranks, basis gpu, steps 3-5"
    assert section(text, "collectives")[0] == "collectives of steps 3-5 (by total time)"


def test_text_collectives_keep_the_group_name_whole() -> None:
    """A group's name is how a reader finds the group ("defaul.." named none): the line runs long instead."""
    doc = make_doc()
    doc["collectives"] = [dict(doc["collectives"][0], process_group="7 (a very long process group name)")]
    row = section(render_text(doc, width=100), "collectives")[2]
    assert row.startswith("all_reduce  7 (a very long process group name)  ")


def test_text_stragglers() -> None:
    rows = table_rows(section(render_text(make_doc()), "stragglers"))
    assert rows["3"] == {"rank": "3", "matched": "350", "last": "301", "last %": "86.0%", "mean late": "3.10 ms",
                         "p99 late": "12.0 ms"}
    assert list(rows) == ["3", "0"]


def test_text_stragglers_top_ten() -> None:
    doc = make_doc()
    doc["stragglers"] = [{"rank": r, "matched": 10, "last_arrivals": 20 - r, "mean_lateness_s": None,
                          "p99_lateness_s": None} for r in range(15)]
    rows = table_rows(section(render_text(doc), "stragglers"))
    assert list(rows) == [str(r) for r in range(10)]
    assert rows["0"]["mean late"] == "-"


def test_text_module_tree_has_subtotals() -> None:
    assert section(render_text(make_doc()), "modules")[1:] == [
        "MLPModule",
        "  FORWARD PASS",
        "    all_reduce: 1, 2.00 KiB, 2 ranks",
        "    broadcast: 1, 64 B, 4 ranks",
        "  BACKWARD PASS",
        "    all_reduce: 3, 4.00 KiB, 4 ranks",
        "  net1",
        "    BACKWARD PASS",
        "      all_reduce: 2, 2.00 KiB, 4 ranks",
        "  net2",
        "    FORWARD PASS",
        "      all_reduce: 1, 2.00 KiB, 2 ranks",
        "    BACKWARD PASS",
        "      all_reduce: 1, 2.00 KiB, 4 ranks",
    ]


def test_text_module_tree_orders_numbered_children_and_unknown_pass() -> None:
    doc = make_doc()
    doc["modules"] = [{"path": f"model.layers.{i}", "pass": None, "op": "all_gather", "count": 1, "bytes": None,
                       "ranks": None} for i in (10, 2)]
    assert section(render_text(doc), "modules")[1:] == [
        "model", "  all_gather: 2",
        "  layers", "    all_gather: 2",
        "    2", "      all_gather: 1",
        "    10", "      all_gather: 1",
    ]
    # A module with a known pass as well gets a heading for the rest.
    doc["modules"].append({"path": "model.layers.2", "pass": "forward", "op": "all_reduce", "count": 3,
                           "bytes": None, "ranks": None})
    assert section(render_text(doc), "modules")[11:] == [
        "    2", "      FORWARD PASS", "        all_reduce: 3",
        "      OUTSIDE FORWARD AND BACKWARD", "        all_gather: 1",
        "    10", "      all_gather: 1",
    ]


def test_text_notes_wrap_to_the_width() -> None:
    lines = section(render_text(make_doc(), width=60), "notes")
    assert lines[1].startswith("- rank 3 has no GPU kernels")
    assert all(len(line) <= 60 for line in lines) and len(lines) > 2
    assert all(line.startswith("  ") for line in lines[2:])


def test_text_missing_values_and_empty_sections() -> None:
    doc = {"version": 1, "basis": "cpu", "world_size": None, "job": {**UNKNOWN, "ranks": 1},
           "ranks": {"0": {**UNKNOWN, "span_s": 0.5, "basis": "cpu", "sources": []}},
           "steps": [], "collectives": [], "stragglers": [], "modules": [],
           "lateness_map": {"ranks": [], "collectives": [], "lateness_s": []}, "groups": {}, "notes": [],
           "sampled": None, "clock": None}
    text = render_text(doc)
    assert "job: span -, comm/compute -, overlap -, exposed comm -" in text
    assert table_rows(section(text, "ranks"))["0"]["compute"] == "-"
    assert "collectives: none" in text
    for absent in ("steps", "stragglers", "modules", "notes"):
        assert f"\n{absent}" not in text


def test_text_deterministic_and_no_trailing_whitespace() -> None:
    doc = make_doc()
    shuffled = copy.deepcopy(doc)
    shuffled["ranks"] = dict(reversed(list(shuffled["ranks"].items())))
    text = render_text(doc)
    assert text == render_text(shuffled)
    assert text.endswith("\n") and not text.endswith("\n\n")
    assert all(line == line.rstrip() for line in text.splitlines())


def test_text_empty_document() -> None:
    empty = {"version": 1, "basis": None, "world_size": None, "job": {**UNKNOWN, "ranks": 0}, "ranks": {},
             "steps": [], "collectives": [], "stragglers": [], "modules": [],
             "lateness_map": {"ranks": [], "collectives": [], "lateness_s": []}, "groups": {}, "notes": [],
             "sampled": None, "clock": None}
    assert render_text(empty).splitlines()[:2] == ["comm2perfetto report: 0 ranks, basis -, the whole run",
                                                   "job: span -, comm/compute -, overlap -, exposed comm - "
                                                   "(times: mean per rank)"]


# --- CSV ----------------------------------------------------------------------------------------------------


def test_csv_tables_present() -> None:
    assert list(render_csv(make_doc())) == ["ranks", "collectives", "steps", "modules"]
    doc = make_doc()
    doc["steps"], doc["modules"] = [], []
    assert list(render_csv(doc)) == ["ranks", "collectives"]


def test_csv_ranks_read_back_to_the_same_numbers() -> None:
    doc = make_doc()
    doc["ranks"]["2"]["idle_s"] = None
    rows = list(csv.DictReader(io.StringIO(render_csv(doc)["ranks"])))
    assert tuple(rows[0]) == RANK_COLUMNS
    assert [r["rank"] for r in rows] == ["0", "1", "2", "3"]
    for row in rows:
        expected = doc["ranks"][row["rank"]]
        assert row["basis"] == "gpu"
        assert row["sources"] == "kineto gpu kernels; flight recorder"
        for key in RANK_COLUMNS[2:-1]:
            assert (float(row[key]) if row[key] else None) == expected[key], key
    assert rows[2]["idle_s"] == ""


def test_csv_collectives_read_back() -> None:
    doc = make_doc()
    rows = list(csv.DictReader(io.StringIO(render_csv(doc)["collectives"])))
    assert tuple(rows[0]) == COLLECTIVE_COLUMNS
    assert [r["op"] for r in rows] == ["all_reduce", "all_gather_into_tensor", "barrier"]
    assert int(rows[0]["bytes"]) == 300 * 25 * 2**20 and int(rows[1]["timed"]) == 40
    assert float(rows[0]["p99_s"]) == 0.0042 and float(rows[1]["busbw_gbps"]) == 0.0655
    assert rows[2]["algbw_gbps"] == ""


def test_csv_steps_have_a_job_row_then_ranks() -> None:
    rows = list(csv.DictReader(io.StringIO(render_csv(make_doc())["steps"])))
    assert [(r["step"], r["rank"]) for r in rows[:5]] == [("3", "job"), ("3", "0"), ("3", "1"), ("3", "2"),
                                                          ("3", "3")]
    assert len(rows) == 15 and float(rows[0]["span_s"]) == 0.4


def test_csv_modules() -> None:
    rows = list(csv.DictReader(io.StringIO(render_csv(make_doc())["modules"])))
    assert rows[1] == {"path": "MLPModule.net1", "pass": "backward", "op": "all_reduce", "count": "2",
                       "bytes": "2048", "ranks": "4"}


def test_csv_quotes_commas() -> None:
    doc = make_doc()
    doc["collectives"][0]["process_group"] = 'pg "a", b'
    rows = list(csv.DictReader(io.StringIO(render_csv(doc)["collectives"])))
    assert rows[0]["process_group"] == 'pg "a", b'


def test_csv_stdout_is_ranks_blank_line_collectives() -> None:
    doc = make_doc()
    ranks, collectives = render_csv_stdout(doc).split("\n\n")
    tables = render_csv(doc)
    assert ranks + "\n" == tables["ranks"] and collectives == tables["collectives"]


@pytest.mark.parametrize("name", ["out.csv", "out.CSV", "out"])
def test_write_csv_files_next_to_the_path(tmp_path: Path, name: str) -> None:
    doc = make_doc()
    written = write_csv(doc, tmp_path / name)
    assert [p.name for p in written] == ["out.ranks.csv", "out.collectives.csv", "out.steps.csv",
                                         "out.modules.csv"]
    tables = render_csv(doc)
    for path, table in zip(written, tables.values()):
        assert path.read_bytes() == table.encode()


# --- HTML ---------------------------------------------------------------------------------------------------


def charts(html_text: str) -> tuple[TreeBuilder, list[Element]]:
    tree = parse_html(html_text)
    return tree, tree.root.all("svg")


def test_html_is_self_contained() -> None:
    tree, svgs = charts(render_html(make_doc()))
    assert len(svgs) == 2  # bars and heat map
    for tag in ("script", "link", "img", "iframe", "object", "embed", "image", "use"):
        assert not tree.root.all(tag), tag
    assert not [v for v in tree.attr_values if "http" in v or "//" in v]  # no URL anywhere but in text
    assert not re.search(r"url\(|@import", tree.root.all("style")[0].text)
    assert any("https://example.com/x" in d for d in tree.data)  # the note's text is kept, escaped


def test_html_bars_one_rect_per_non_zero_segment() -> None:
    doc = make_doc()
    doc["ranks"]["1"]["overlapped_comm_s"] = 0.0  # rank 1: no overlapped segment
    doc["ranks"]["2"]["idle_s"] = None  # rank 2: no idle segment
    _, svgs = charts(render_html(doc))
    groups = svgs[0].all("g", "rank")
    assert len(groups) == 4
    kinds = [[r.attrs["class"].split()[1] for r in g.all("rect", "seg")] for g in groups]
    assert kinds == [["compute", "overlapped", "exposed", "idle"], ["compute", "exposed", "idle"],
                     ["compute", "overlapped", "exposed"], ["compute", "overlapped", "exposed", "idle"]]
    assert len(svgs[0].all("rect", "swatch")) == 4  # the legend


def test_html_bar_widths_are_proportional() -> None:
    _, svgs = charts(render_html(make_doc()))
    rank3 = svgs[0].all("g", "rank")[3]
    widths = {r.attrs["class"].split()[1]: float(r.attrs["width"]) for r in rank3.all("rect", "seg")}
    scale = report_plot.PLOT_W / 1.2  # every rank spans 1.2 s, the longest bar fills the plot
    for kind, seconds in bar_segments(make_doc()["ranks"]["3"]):
        assert widths[kind] == pytest.approx(seconds * scale, abs=0.01)
    xs = [float(r.attrs["x"]) for r in rank3.all("rect", "seg")]
    assert xs[0] == report_plot.GUTTER and xs == sorted(xs)  # stacked left to right


def test_html_bar_tooltip_has_the_ranks_numbers() -> None:
    _, svgs = charts(render_html(make_doc()))
    title = svgs[0].all("g", "rank")[3].all("title")[0].text
    assert title == ("rank 3: span 1.20 s; compute 700 ms (600 ms without comm); comm 450 ms = 100 ms overlapped"
                     " + 350 ms exposed; idle 150 ms; comm/compute 0.64; overlap 22.2%")


def test_html_heatmap_cells_runs_and_no_data() -> None:
    _, svgs = charts(render_html(make_doc()))
    cells = svgs[1].all("rect", "cell")
    # Ranks 0-2 are on time except rank 0's missing barrier: rank 0 = run of 2 + grey cell, ranks 1 and 2 one
    # run each; rank 3 has three different levels.
    assert len(cells) == 2 + 1 + 1 + 3
    grey = [c for c in cells if c.attrs["fill"] == report_plot.NO_DATA_COLOUR]
    assert len(grey) == 1 and grey[0].all("title")[0].text == "rank 0, barrier 0:3: no data"
    rank3 = cells[-3:]
    assert [c.all("title")[0].text for c in rank3] == ["rank 3, all_reduce 0:1: 1.00 ms late",
                                                       "rank 3, all_reduce 0:2: 4.00 ms late",
                                                       "rank 3, barrier 0:3: 2.00 ms late"]
    assert rank3[1].attrs["fill"] == report_plot.level_colour(report_plot.HEAT_LEVELS - 1)
    assert cells[0].all("title")[0].text == "rank 0, all_reduce 0:1 .. all_reduce 0:2 (2 collectives): 0 s late"
    assert float(cells[0].attrs["width"]) == pytest.approx(2 * report_plot.PLOT_W / 3, abs=0.01)
    legend = svgs[1].all("rect", "swatch")
    assert len(legend) == report_plot.HEAT_LEVELS + 1  # the bins and "no data"


def test_html_empty_lateness_map_gives_a_note() -> None:
    doc = make_doc()
    doc["lateness_map"] = {"ranks": [], "collectives": [], "lateness_s": []}
    tree, svgs = charts(render_html(doc))
    assert len(svgs) == 1
    assert any("no lateness data" in d for d in tree.data)


def test_html_tables() -> None:
    doc = make_doc()
    tree, _ = charts(render_html(doc))
    tables = tree.root.all("table")
    # header, job summary, ranks, steps, collectives, stragglers, modules
    assert len(tables) == 7
    summary = [td.text for td in tables[1].all("td")]
    assert summary[:3] == ["4", "gpu", "1.20 s"] and "160 ms" in summary
    first = [td.text for td in tables[4].all("tr")[1].all("td")]
    assert first[:2] == ["all_reduce", "0 (default_pg)"] and "7.32 GiB" in first and "31.4" in first


def test_html_shows_every_ranks_and_steps_numbers_as_the_text_does() -> None:
    """The per-rank numbers are in the page (not only in tooltips), with the job's row, and the per-step table
    the text and JSON have: the same cells as the text's tables."""
    doc = make_doc()
    tables = charts(render_html(doc))[0].root.all("table")
    ranks = [[td.text for td in tr.all("td")] for tr in tables[2].all("tr")[1:]]
    assert [r[0] for r in ranks] == ["0", "1", "2", "3", "job"]
    text = render_text(doc).splitlines()
    for row in ranks:
        line = next(t for t in text if t.split()[:1] == [row[0]] and "%" in t)
        assert line.split() == [row[0], *" ".join(row[2:]).split()]  # the text has no basis column here
    steps = [[td.text for td in tr.all("td")] for tr in tables[3].all("tr")[1:]]
    assert [s[0] for s in steps] == ["3", "4", "5"]
    step_lines = text[text.index("steps (job values: times are means over ranks)") + 2:][:3]
    assert [" ".join(s) for s in steps] == [" ".join(line.split()) for line in step_lines]


def test_html_header_says_what_the_report_covers() -> None:
    doc = make_doc()
    doc.update(paths=["runs/job7"], world_size=4,
               clock={"residual_skew_s": 4.1e-05, "samples": 5, "method": {str(r): "refined" for r in range(4)}})
    tree = charts(render_html(doc))[0]
    title = "comm2perfetto report: runs/job7 (4 ranks, steps 3-5, basis gpu)"
    assert tree.root.all("title")[0].text == title and tree.root.all("h1")[0].text == title
    facts = {tr.all("th")[0].text: tr.all("td")[0].text for tr in tree.root.all("table")[0].all("tr")}
    assert facts == {"folder": "runs/job7", "ranks": "4 with data (ranks 0-3) of world size 4",
                     "steps": "3-5 (3 steps)", "basis": "gpu (flight recorder, kineto gpu kernels)",
                     "clocks": "clocks aligned to rank 0; residual skew 41.0 us (5 collective ends)"}
    # The page words the clocks as the text report does: one sentence, from words.
    assert facts["clocks"] in render_text(doc)
    doc["clock"] = {"method": {"0": "assumed", "1": "assumed"}, "residual_skew_s": None, "samples": 0}
    assert document_clock_text(doc["clock"]) == (
        "clocks: not aligned (each rank on its own clock): no recorder measurement, and too few collective ends to "
        "align on")
    assert document_clock_text({"method": {"0": "measured"}, "residual_skew_s": None, "samples": 0}) == \
        "clocks: one rank, nothing to align"
    assert document_clock_text(None) is None


def test_html_draws_ranks_without_data_as_no_data() -> None:
    """A job of 6 ranks whose data covers 4: two grey bars, a "no data" legend entry."""
    doc = make_doc()
    doc["world_size"] = 6
    svg = charts(render_html(doc))[1][0]
    grey = svg.all("rect", "nodata")
    assert [r.all("title")[0].text for r in grey] == ["rank 4: no data", "rank 5: no data"]
    assert {r.attrs["fill"] for r in grey} == {NO_DATA_COLOUR}
    assert "no data" in [t.text for t in svg.all("text")]
    assert not charts(render_html(make_doc()))[1][0].all("rect", "nodata")


def test_html_escapes_text() -> None:
    doc = make_doc()
    doc["modules"][0]["path"] = "Model.<script>alert(1)</script>"
    doc["collectives"][0]["process_group"] = '"><b>pg</b>'
    doc["notes"] = ["a & b <i>"]
    page = render_html(doc)
    tree = parse_html(page)
    assert not tree.root.all("script") and not tree.root.all("b") and not tree.root.all("i")
    assert "&lt;script&gt;" in page
    texts = [td.full_text() for td in tree.root.all("td")]
    assert "Model.<script>alert(1)</script>" in texts and '"><b>pg</b>' in texts
    assert "a & b <i>" in [li.text for li in tree.root.all("li")]


def test_html_one_rank_and_missing_values() -> None:
    doc = make_doc(1)
    doc["ranks"]["0"].update(compute_s=None, overlapped_comm_s=None, idle_s=None)
    doc["job"] = {**UNKNOWN, "ranks": 1}
    _, svgs = charts(render_html(doc))
    group = svgs[0].all("g", "rank")[0]
    assert [r.attrs["class"] for r in group.all("rect", "seg")] == ["seg exposed"]
    assert "compute - (- without comm)" in group.all("title")[0].text


def test_html_1024_ranks_thin_bars_labelled_every_nth() -> None:
    doc = many_ranks_doc(1024)
    doc["lateness_map"] = {"ranks": list(range(1024)), "collectives": [f"all_reduce 0:{i}" for i in range(200)],
                           "lateness_s": [[(r % 7) * 1e-4 for _ in range(200)] for r in range(1024)]}
    _, svgs = charts(render_html(doc))
    assert len(svgs[0].all("g", "rank")) == 1024
    heights = {float(r.attrs["height"]) for r in svgs[0].all("rect", "seg")}
    assert heights == {1.0}  # one px a rank, no gaps
    labels = [t.text for t in svgs[0].all("text")]
    assert "0" in labels and "16" in labels and "1008" in labels and "1" not in labels and "15" not in labels
    assert len(svgs[1].all("rect", "cell")) == 1024  # each row is one run of one colour


def test_html_is_deterministic() -> None:
    assert render_html(make_doc()) == render_html(copy.deepcopy(make_doc()))


# --- write_plot ---------------------------------------------------------------------------------------------


def test_write_plot_html(tmp_path: Path) -> None:
    path = write_plot(make_doc(), tmp_path / "r.HTML")
    assert path.read_text(encoding="utf-8") == render_html(make_doc())


def test_write_plot_rejects_other_suffixes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\.html, \.png, \.svg"):
        write_plot(make_doc(), tmp_path / "r.pdf")
    assert not (tmp_path / "r.pdf").exists()


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_write_plot_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # "import matplotlib" raises ImportError
    with pytest.raises(PlotDependencyError) as info:
        write_plot(make_doc(), tmp_path / f"r{suffix}")
    assert str(info.value) == (f"writing {suffix} needs matplotlib: pip install 'comm2perfetto[plot]' "
                               "(or write --plot report.html, which needs nothing)")
    assert isinstance(info.value, ImportError)
    assert not (tmp_path / f"r{suffix}").exists()
    write_plot(make_doc(), tmp_path / "r.html")  # HTML needs nothing


def test_write_plot_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = write_plot(make_doc(), tmp_path / "r.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_write_plot_svg_parses_and_is_deterministic(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    first = write_plot(make_doc(), tmp_path / "a.svg").read_bytes()
    root = ET.fromstring(first)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    texts = "".join(root.itertext())
    assert "time per rank" in texts and "lateness at each collective" in texts
    assert plot_title(make_doc()) in texts  # the picture says what it covers, as the page does
    assert write_plot(make_doc(), tmp_path / "b.svg").read_bytes() == first


@pytest.mark.parametrize("n_ranks", [1, 1024])
def test_write_plot_png_edge_sizes(tmp_path: Path, n_ranks: int) -> None:
    pytest.importorskip("matplotlib")
    doc = many_ranks_doc(n_ranks)
    doc["lateness_map"] = {"ranks": [], "collectives": [], "lateness_s": []}
    doc["ranks"]["0"]["idle_s"] = None
    svg = ET.fromstring(write_plot(doc, tmp_path / "r.svg").read_bytes())
    assert "no lateness data" in "".join(svg.itertext())
    assert write_plot(doc, tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
