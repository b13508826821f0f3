"""``report --plot x.html`` of a real recording, opened in headless Chromium (tests/support/browser.py): the page loads
with no console error, shows both charts and every table, and hovering a bar lands on a tooltip that carries
that rank's numbers from the same report's JSON.

Chromium is Debian's ``chromium`` package, found on PATH; .ci/run installs it, no test does. Without it the
module is skipped with that reason, except under CI (``CI`` set), where a missing browser fails the module:
CI must run these checks, not skip them."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from comm2perfetto.render.report_plot import header_facts, plot_title, rank_tooltip
from support.browser import Browser, find_chromium
from support.cli import run_cli_process
from support.jobs import job_env

# the module's first test waits for its fixtures: a recorded DDP job, its report and a browser
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


PAGE_FACTS = """(() => {
  const text = (e) => e ? e.textContent.trim() : null;
  const bars = document.querySelector('svg g.rank') ? document.querySelector('g.rank').ownerSVGElement : null;
  const hits = [...document.querySelectorAll('rect.seg')].map((r) => {
    const box = r.getBoundingClientRect();
    window.scrollTo(0, box.top + window.scrollY - 100);
    const b = r.getBoundingClientRect();
    const hit = document.elementFromPoint(b.left + b.width / 2, b.top + b.height / 2);
    const group = hit && hit.closest('g.rank');
    return {own: text(r.closest('g.rank').querySelector(':scope > title')),
            hovered: group ? text(group.querySelector(':scope > title')) : null, width: b.width};
  });
  return {
    title: document.title,
    h1: text(document.querySelector('h1')),
    header: [...document.querySelectorAll('table.header th')].map(text),
    headings: [...document.querySelectorAll('h2')].map(text),
    svgs: document.querySelectorAll('svg').length,
    bars_height: bars ? bars.getBoundingClientRect().height : 0,
    rank_titles: [...document.querySelectorAll('g.rank > title')].map(text),
    cell_titles: [...document.querySelectorAll('rect.cell')].map((c) => text(c.querySelector('title'))),
    tables: [...document.querySelectorAll('table')].map((t) => ({
      header: [...t.querySelectorAll('th')].map(text), rows: t.querySelectorAll('tbody tr').length})),
    hits,
  };
})()"""


@pytest.fixture(scope="module")
def chromium() -> str:
    """The browser's path; asked for first, so that a missing browser skips before the job is recorded."""
    path = find_chromium()
    if path is None:
        reason = "no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: CI must run the browser checks")
        pytest.skip(reason)
    return path


@pytest.fixture(scope="module")
def report(example_recordings, tmp_path_factory):
    """The session's 2-rank DDP run on gloo (steps 2-4 profiled), and its report as JSON and as the HTML page."""
    status, rec = example_recordings["ddp"]
    assert status == 0, rec.with_name("ddp.stderr").read_text()
    tmp = tmp_path_factory.mktemp("html")
    page, doc = tmp / "report.html", tmp / "report.json"
    done = run_cli_process("report", str(rec), "--steps", "2-4", "--plot", str(page), "-o", str(doc), env=job_env(),
                           timeout=120)
    assert done.code == 0, done.err
    return page, json.loads(doc.read_text())


@pytest.fixture(scope="module")
def page(chromium, report, tmp_path_factory):
    """What Chromium shows of the page: its DOM facts, the errors it reported, and a screenshot."""
    html, _ = report
    shot = tmp_path_factory.mktemp("shot") / "report.png"
    with Browser(chromium) as browser:
        browser.open(html.as_uri())
        facts = browser.evaluate(PAGE_FACTS)
        browser.evaluate("window.scrollTo(0, 0)")
        browser.screenshot(shot)
        errors = list(browser.errors)
    return facts, errors, shot


def test_the_page_loads_without_a_console_error(page):
    _, errors, _ = page
    assert errors == []


def test_both_charts_and_every_table_are_there(page, report):
    facts, _, _ = page
    _, doc = report
    assert facts["title"] == facts["h1"] == plot_title(doc) and str(doc["paths"][0]) in facts["title"]
    assert facts["headings"][:3] == ["Job (times: mean per rank)", "Time per rank",
                                     "Steps (job values: times are means over ranks)"]
    assert {"Lateness at each collective", "Collectives (by total time)", "Stragglers", "Collectives per module",
            "Notes"} <= set(facts["headings"])
    # the time bars and the lateness map, and a heat map per group of the live windows the recorder wrote
    live_maps = len(doc["live"]["groups"]) if doc.get("live") else 0
    assert facts["svgs"] == 2 + live_maps and facts["bars_height"] > 20
    # header (folder, ranks, steps, basis, clocks), job, per rank, per step, collectives, stragglers, the live
    # windows (where the recorder wrote them), modules
    tables = [(t["header"][0], t["rows"]) for t in facts["tables"]]
    live = [("group", len(doc["live"]["groups"]))] if doc.get("live") else []
    assert tables == [("folder", len(header_facts(doc))), ("ranks", 1), ("rank", len(doc["ranks"]) + 1),
                      ("step", len(doc["steps"])), ("op", len(doc["collectives"])),
                      ("rank", len(doc["stragglers"])), *live, ("module", len(doc["modules"]))]
    assert facts["header"] == [label for label, _ in header_facts(doc)]
    assert [s["step"] for s in doc["steps"]] == [2, 3, 4]


def test_each_bar_hovers_onto_its_ranks_numbers(page, report):
    facts, _, _ = page
    _, doc = report
    expected = [rank_tooltip(r, doc["ranks"][r]) for r in sorted(doc["ranks"], key=int)]
    assert facts["rank_titles"] == expected
    assert all(any(ch.isdigit() for ch in t.split("span", 1)[1]) for t in expected)
    segments = [h for h in facts["hits"] if h["width"] >= 1]  # a sliver under a pixel wide is not hoverable
    assert segments, "no bar segment drawn"
    for hit in segments:
        assert hit["hovered"] == hit["own"], hit


def test_lateness_cells_carry_their_lateness(page, report):
    facts, _, _ = page
    _, doc = report
    late = doc["lateness_map"]
    assert late["ranks"] == [0, 1] and late["collectives"]
    assert facts["cell_titles"] and all(t and any(ch.isdigit() for ch in t) for t in facts["cell_titles"])


def test_the_screenshot_shows_a_page(page, tmp_path_factory):
    _, _, shot = page
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert 1200 <= width <= 1280 and height > 900  # the window's width (less a scroll bar), the whole page
    keep = os.environ.get("C2P_KEEP_SCREENSHOT")  # to look at it: C2P_KEEP_SCREENSHOT=/tmp/report.png
    if keep:
        Path(keep).write_bytes(data)
