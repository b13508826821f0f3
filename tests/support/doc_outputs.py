"""The outputs the Markdown docs show (README.md, examples/README.md, docs/*.md), as checks a test can run.

Every fenced block without a language (an output; a diagram, a grammar or a file's contents is fenced as
``text``) in those files is preceded by one of:

- ``<!-- output of: COMMAND -->``: the block is what COMMAND prints (stdout and stderr together);
- ``<!-- checked -->``: the block is a shell session: each ``$ COMMAND`` line is followed by its output (none
  shown when the next line is another command: that output is not checked);
- ``<!-- not checked: REASON -->``: the block is not compared (a job's own racy prints, a C++ abort text).

A line ``...`` in a shown output stands for lines left out there. Outputs are compared after normalising
what differs between runs and machines: measured times, sizes, ratios and percentages, a lone 0 (a measured
zero has no unit), the folder the commands ran in, recording folder dates, slice counts, the torch version
``record`` names at start-up, torch 2.8 gloo's own "[Gloo] Rank N is connected" lines, and spacing (so table
columns and line wrapping may shift).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

# The folder the documented commands ran in, as the docs write it.
DOC_CWD = "/home/me/comm2perfetto"
ELLIPSIS = "..."

_MARKER = re.compile(r"^<!--\s*(output of:|checked|not checked:)\s*(.*?)\s*-->\s*$")
_FENCE = re.compile(r"^```(\S*)\s*$")


@dataclass
class Step:
    command: str
    expected: list[str] | None  # None: output not shown


@dataclass
class Block:
    doc: str
    line: int  # where the block starts (1-based), for messages
    kind: str  # "output of", "checked", "not checked" or "" (no marker)
    steps: list[Step] = field(default_factory=list)
    note: str = ""


def parse_blocks(doc: str, text: str) -> list[Block]:
    """The output blocks of a Markdown text, in order."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        lang = fence.group(1)
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
        body = lines[i + 1:end]
        if not lang:
            prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            marker = _MARKER.match(prev.strip())
            kind = marker.group(1).rstrip(":") if marker else ""
            arg = marker.group(2) if marker else ""
            block = Block(doc, i + 1, kind, note=arg)
            if kind == "output of":
                block.steps.append(Step(arg, body))
            elif kind == "checked":
                block.steps = _session(body)
            blocks.append(block)
        i = end + 1
    return blocks


def _session(body: list[str]) -> list[Step]:
    steps: list[Step] = []
    for line in body:
        if line.startswith("$ "):
            steps.append(Step(line[2:], None))
        elif steps:
            if steps[-1].expected is None:
                steps[-1].expected = []
            steps[-1].expected.append(line)
    return steps


_QUANTITY = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:ns|us|ms|s|[KMGT]iB|KB|MB|GB|B|%|x)(?![\w])")
_DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])")
_SLICES = re.compile(r"\d[\d,]* (slices|instants)")
_RUN_DATE = re.compile(r"comm2perfetto-\d{8}-\d{6}")
_ZERO = re.compile(r"(?<!\S)0(?!\S)")  # a measured 0 prints without a unit (a rank label 0 goes with it)
_TORCH = re.compile(r"comm2perfetto: torch \S+: ")  # record's start-up line: "torch 2.13.0+cpu: C++-issued ..."
# torch 2.8's gloo prints one per rank as its group connects, in no set order among the job's lines and
# with the ranks' prints interleaved ("[Gloo] Rank 1[Gloo] Rank 0 is connected to ..."):
# "[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1"
_GLOO_CONNECTED = re.compile(r"\[Gloo\] Rank \d+|\bis connected to \d+ peer ranks\. Expected number of connected "
                             r"peer ranks is : \d+")


def normalise(text: str, cwd: str) -> str:
    """One line of tokens with what legitimately varies between runs replaced."""
    text = _GLOO_CONNECTED.sub("", text)
    text = text.replace(cwd, "<cwd>").replace(DOC_CWD, "<cwd>")
    text = _TORCH.sub("comm2perfetto: torch <version>: ", text)
    text = _RUN_DATE.sub("comm2perfetto-<date>", text)
    text = _SLICES.sub(r"<n> \1", text)
    text = _QUANTITY.sub("<q>", text)
    text = _DECIMAL.sub("<n>", text)
    text = _ZERO.sub("<q>", text)
    return " ".join(text.split())


def mismatch(expected: list[str], actual: str, cwd: str) -> str | None:
    """None when ``actual`` is what ``expected`` shows, else why not. ``...`` lines skip any output; the
    first shown line starts the output and the last ends it unless ``...`` stands before or after them."""
    segments: list[list[str]] = [[]]
    for line in expected:
        if line.strip() == ELLIPSIS:
            segments.append([])
        else:
            segments[-1].append(line)
    have = normalise(actual, cwd)
    pos = 0
    for k, seg in enumerate(segments):
        want = normalise("\n".join(seg), cwd)
        if not want:
            continue
        found = have.find(want, pos)
        anchored_start = k == 0
        if found < 0 or (anchored_start and found != 0):
            return (f"shown (normalised):\n  {want}\nnot found {'at the start of' if anchored_start else 'in'} "
                    f"the output after position {pos} (normalised):\n  {have[pos:]}")
        pos = found + len(want)
    if segments[-1] and pos != len(have):
        return f"the output goes on after what is shown (normalised):\n  {have[pos:]}"
    return None


def docs(root: Path) -> list[str]:
    """The documents whose outputs are checked, as paths relative to the repository's root."""
    return ["README.md", "examples/README.md", *sorted(f"docs/{p.name}" for p in (root / "docs").glob("*.md"))]


def doc_blocks(root: Path) -> list[Block]:
    return [b for doc in docs(root) for b in parse_blocks(doc, (root / doc).read_text())]
