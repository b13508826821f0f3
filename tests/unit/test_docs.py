"""The Markdown docs hold together: every link reaches a file and heading that exist, every shown output is
marked as checked or says why not (tests/integration/test_docs_outputs.py runs the checked ones), and no
figure is tied to a commit hash in prose (a table says the date, the machine and the command instead)."""

from __future__ import annotations

import re
from pathlib import Path

from support.doc_outputs import doc_blocks, docs

ROOT = Path(__file__).resolve().parents[2]
MARKDOWN = sorted({*(ROOT / d for d in docs(ROOT)), *ROOT.glob("tests/**/README.md")})

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)|<img\s[^>]*src=\"([^\"]+)\"")
_FENCED = re.compile(r"^```.*?^```", re.S | re.M)
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
# a file of the repository named in backquotes: `tests/unit/test_docs.py`, `benchmarks/bench_scale.py`
_REPO_PATH = re.compile(r"`((?:src|tests|benchmarks|docs|examples)/[\w/.\-]*\.(?:py|sh|md))`")
_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
# other projects' commits, naming the public data taken from them: HolisticTraceAnalysis's tests/data, which the
# HTA comparison read (docs/report.md), and TraceLens's traces kept in tests/data/kineto
_OTHER_PROJECTS_COMMITS = {"f4d0062", "171dd747"}


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces as
    hyphens: ``Restarts (torchrun `--max-restarts`)`` is ``#restarts-torchrun---max-restarts``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor, a repeated one numbered as GitHub numbers it (``-1``, ``-2``)."""
    found: set[str] = set()
    for heading in _HEADING.findall(_FENCED.sub("", path.read_text())):
        base, n = slug(heading), 0
        while (anchor := base if n == 0 else f"{base}-{n}") in found:
            n += 1
        found.add(anchor)
    return found


def links(path: Path) -> list[str]:
    prose = _FENCED.sub("", path.read_text())
    return [a or b for a, b in _LINK.findall(prose)]


def test_the_docs_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in MARKDOWN}
    assert {"README.md", "examples/README.md", "docs/performance.md", "docs/reliability.md",
            "docs/torch-versions.md", "tests/gpu/README.md"} <= names


def test_every_link_reaches_a_file_and_heading_that_exist():
    broken = []
    for doc in MARKDOWN:
        for target in links(doc):
            if re.match(r"[a-z]+:", target):  # https:, mailto: ... (nothing outside the repository is fetched)
                continue
            file, _, anchor = target.partition("#")
            dest = (doc.parent / file).resolve() if file else doc
            where = f"{doc.relative_to(ROOT)}: ({target})"
            if not dest.exists():
                broken.append(f"{where}: no such file")
            elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
                broken.append(f"{where}: no heading #{anchor} in {dest.name}")
    assert not broken, "\n".join(broken)


def test_anchors_are_made_as_github_makes_them():
    assert slug("Restarts (torchrun `--max-restarts`)") == "restarts-torchrun---max-restarts"
    assert slug("Scale: 16,384 ranks on one machine") == "scale-16384-ranks-on-one-machine"
    assert slug("The dispatcher fallback (torch 2.4 to 2.7 with gloo)") == \
        "the-dispatcher-fallback-torch-24-to-27-with-gloo"
    assert slug("`comm2perfetto record`: what a job leaves behind") == "comm2perfetto-record-what-a-job-leaves-behind"


def test_the_checks_see_links_headings_and_files():
    readme = ROOT / "README.md"
    assert "docs/img/demo_report.png" in links(readme) and "docs/diagnose.md" in links(readme)
    assert "scale-16384-ranks-on-one-machine" in anchors(ROOT / "docs" / "performance.md")
    named = _REPO_PATH.findall((ROOT / "docs" / "reliability.md").read_text())
    assert "tests/unit/test_sources_hostile_inputs.py" in named


def test_every_file_named_is_there():
    """Files named in backquotes (tests, benchmarks, sources) exist: a renamed test or module is renamed here too."""
    missing = [f"{doc.relative_to(ROOT)}: {path}" for doc in MARKDOWN for path in _REPO_PATH.findall(doc.read_text())
               if not (ROOT / path).exists() and not (doc.parent / path).exists()]
    assert not missing, "\n".join(missing)


def test_every_shown_output_is_marked():
    blocks = doc_blocks(ROOT)
    unmarked = [f"{b.doc}:{b.line}" for b in blocks if not b.kind]
    assert not unmarked, ("output blocks with neither <!-- output of: CMD -->, <!-- checked --> nor "
                          f"<!-- not checked: why --> (a block that is no output is fenced as ```text): {unmarked}")
    unchecked = [f"{b.doc}:{b.line}" for b in blocks if b.kind == "not checked" and not b.note]
    assert not unchecked, f"a <!-- not checked: --> block must say why: {unchecked}"
    checked = {b.doc for b in blocks if b.steps}
    assert {"README.md", "examples/README.md", "docs/record.md"} <= checked


def test_no_commit_hash_in_the_docs_prose():
    found = [f"{doc.relative_to(ROOT)}: {h}" for doc in MARKDOWN
             for h in _HASH.findall(_FENCED.sub("", doc.read_text())) if h not in _OTHER_PROJECTS_COMMITS]
    assert not found, "figures say their date, machine and command, not a commit: " + ", ".join(found)
