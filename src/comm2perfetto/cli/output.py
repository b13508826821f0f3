"""Writing a document in the format asked for: text, JSON or CSV, to stdout or ``-o FILE`` (report, compare).

The renderers differ by command; where the text goes, how errors read and what is said on stderr do not.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import orjson

from comm2perfetto.cli import UserError, check_writable, write_stdout
from comm2perfetto.errors import writing

FORMAT_OF_SUFFIX = {".json": "json", ".csv": "csv", ".txt": "text"}


Doc = TypeVar("Doc", bound=Mapping[str, Any])  # a command's document: report_doc.ReportDoc, compare's


@dataclass(frozen=True)
class Renderers(Generic[Doc]):
    """A command's renderers: the text, CSV on stdout, and CSV files next to ``-o FILE`` (returns their paths)."""

    text: Callable[[Doc], str]
    csv_stdout: Callable[[Doc], str]
    write_csv: Callable[[Doc, Path], list[Path]]


def output_options(args: argparse.Namespace, plot_suffixes: tuple[str, ...]) -> tuple[Path | None, str, Path | None]:
    """``-o``, ``--format`` and ``--plot``, checked before the (long) loading: (output file or None for stdout,
    format: ``--format``, else ``-o``'s suffix, else text; plot file or None). An ``-o`` suffix of no format
    (``r.xlsx``) without ``--format`` is refused rather than given text."""
    out = Path(args.output) if args.output else None
    if out is not None and args.format is None and out.suffix and out.suffix.lower() not in FORMAT_OF_SUFFIX:
        drawn = f" ({out.suffix} is what --plot draws: --plot {out})" if out.suffix.lower() in plot_suffixes else ""
        raise UserError(f"-o {out}: unknown format {out.suffix!r}: name it "
                        f"{', '.join('FILE' + s for s in FORMAT_OF_SUFFIX)} (no suffix: text), or give --format"
                        f"{drawn}")
    fmt = args.format or (FORMAT_OF_SUFFIX.get(out.suffix.lower(), "text") if out is not None else "text")
    if out is not None:
        check_writable(out)
    plot = Path(args.plot) if args.plot else None
    if plot is not None:
        if plot.suffix.lower() not in plot_suffixes:
            raise UserError(f"--plot writes {', '.join(plot_suffixes)}: not {plot.name!r}")
        check_writable(plot)
    return out, fmt, plot


def emit(doc: Doc, fmt: str, out: Path | None, command: str, renderers: Renderers[Doc]) -> None:
    """Write ``doc`` as ``fmt`` to ``out`` (saying so on stderr) or stdout; UserError when it cannot."""
    if fmt == "csv" and out is not None:
        with writing(out):
            written = renderers.write_csv(doc, out)
        print(f"comm2perfetto {command}: wrote " + ", ".join(map(str, written)), file=sys.stderr)
        return
    if fmt == "json":
        text = orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode() + "\n"
    elif fmt == "csv":
        text = renderers.csv_stdout(doc)
    else:
        text = renderers.text(doc)
    if out is not None:
        with writing(out):
            out.write_text(text)
        print(f"comm2perfetto {command}: wrote {out}", file=sys.stderr)
        return
    write_stdout(text)  # `comm2perfetto report DIR | head`
