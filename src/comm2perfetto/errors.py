"""The one root of the errors comm2perfetto raises on purpose: something about an input or an option that the
user can fix, said in one line that names it and what to do. ``comm2perfetto`` prints that line and exits 2
(``cli.main``, the only place that catches this root); any other exception escaping a command is a bug (exit 3).

Each error lives where it is raised and derives from this root as well as from the built-in base its callers
catch, so a reader that skips a bad file on ``ValueError`` keeps doing so::

    Comm2PerfettoError
    ├── cli.UserError                        a bad option, an output that cannot be written
    ├── OptionError (ValueError)             a value given to the CLI or the API that cannot be used
    ├── OutputError                          an output that cannot be written (``writing``)
    ├── sources.discover.SourceError         no usable input (nothing recognised, an unreadable path)
    │   └── sources.checks.MixedJobsError    the files of several jobs in the folders given
    ├── compare.sides.SideError              one side of a comparison that cannot be read (named BASE or NEW)
    ├── sources.fr.dump.FrFormatError (ValueError)              a Flight Recorder dump that cannot be read
    ├── sources.event_log.EventLogError (ValueError)            a recorder log that cannot be read
    ├── sources.kineto.reader.KinetoFormatError (ValueError)    a profiler trace that cannot be read
    ├── sources.live.LiveSnapshotError (ValueError)             a live verdict snapshot that cannot be used
    ├── sources.limits.TooLargeError (ValueError)               a file beyond the bounds any real one has
    ├── sources.safe_pickle.UnsafePickleError (UnpicklingError) a pickle that asks for a class
    ├── render.report_plot.PlotDependencyError (ImportError)    --plot .png/.svg without matplotlib
    └── trace.check.TraceRuleError                              a written trace that breaks a rule

Standard library only and no import of comm2perfetto: the recorder and every reader import it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["Comm2PerfettoError", "OptionError", "OutputError", "writing"]


class Comm2PerfettoError(Exception):
    """An error the user can fix: one line (``str(exc)``) saying what and what to do, exit status 2."""


class OptionError(Comm2PerfettoError, ValueError):
    """A value given on the command line or to the API that cannot be used: ``--trace-rank a.json`` without
    ``=RANK``, an output folder that cannot be written, an output suffix no writer knows."""


class OutputError(Comm2PerfettoError):
    """An output that cannot be written: ``cannot write run1.pftrace: No space left on device``."""


@contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Turn an ``OSError`` raised while writing ``path`` into the one line every command says it with."""
    try:
        yield
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
