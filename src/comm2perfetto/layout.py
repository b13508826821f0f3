"""File names in a recording folder (docs/log-format.md): the one place the recorder that writes them and
the readers that find them take them from, and how a file is written there. Never imports torch."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping


def write_whole(path: str, data: bytes) -> None:
    """Write ``data`` to a temporary name beside ``path`` and rename it: a reader never sees half a file."""
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)

JOB_FILE = "job.json"  # written by versions before the per-node name below


def job_file(host: str, pid: int) -> str:
    """``job.<host>.<pid>.json``: one per ``record`` process, so that the folders of a job's nodes (one
    ``record`` per node, or per task under srun) can be copied into one without overwriting each other."""
    return f"job.{host}.{pid}.json"

TORCH_DUMP_PREFIX = "torch_fr_rank_"  # torch's own timeout dumps, pointed into the folder


def event_log(rank: int) -> str:
    return f"rank{rank}.events.jsonl"


def fr_dump(rank: int, kind: str, n: int) -> str:
    """``kind``: ``fr`` (generic dump) or ``fr-nccl``."""
    return f"rank{rank}.{kind}.{n}.pkl"


def stacks(rank: int, n: int) -> str:
    return f"rank{rank}.stacks.{n}.json"


def kineto(rank: int, n: int) -> str:
    return f"rank{rank}.kineto.{n}.json.gz"


# torchrun's elastic restarts (``--max-restarts N``) start every worker again with this variable counting the
# attempts from 0. Each attempt writes its files apart, under the same names: attempt 0 (and a job never
# restarted) into the recording folder itself, attempt k >= 1 into its sub-folder ``attempt<k>``. A folder
# holds a complete recording of its attempt; readers take the last attempt by default (docs/log-format.md).
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
MAX_RESTARTS_ENV = "TORCHELASTIC_MAX_RESTARTS"
ATTEMPT_DIR_GLOB = "attempt[0-9]*"
_ATTEMPT_DIR = re.compile(r"attempt([0-9]{1,6})")


def restart_count(environ: Mapping[str, str]) -> int | None:
    """torchrun's number for this attempt (``TORCHELASTIC_RESTART_COUNT``: 0 first), None outside torchrun."""
    value = environ.get(RESTART_COUNT_ENV, "")
    return int(value) if value.isdigit() and len(value) <= 6 else None


def attempt_dir(out_dir: str, attempt: int | None) -> str:
    """Where attempt ``attempt`` writes: ``out_dir`` for attempt 0 (or None), ``out_dir/attempt<k>`` after."""
    return os.path.join(out_dir, f"attempt{attempt}") if attempt else out_dir


def attempt_of_folder(name: str) -> int | None:
    """``attempt2`` -> 2; any other folder name -> None."""
    m = _ATTEMPT_DIR.fullmatch(name)
    return int(m[1]) if m else None


def attempt_folders(out_dir: str) -> dict[int, str]:
    """The attempts' folders of a recording: ``{0: out_dir, 2: out_dir/attempt2}`` (0 always listed)."""
    found = {0: out_dir}
    try:
        names = os.listdir(out_dir)
    except OSError:
        return found
    for name in names:
        attempt = attempt_of_folder(name)
        if attempt and os.path.isdir(os.path.join(out_dir, name)):
            found[attempt] = os.path.join(out_dir, name)
    return dict(sorted(found.items()))


LIVE_DIR = ".live"  # hidden: readers walking the folder skip it
STALL_VERDICT_FILE = "stall-verdict.json"  # the latest live verdict, written by `comm2perfetto record`


def live_snapshot(gen: int) -> str:
    """Every rank's position at stall ``gen``, gathered through the store (record/live.py)."""
    return f"{LIVE_DIR}/stall.{gen}.json"


def live_resolved(gen: int) -> str:
    return f"{LIVE_DIR}/stall.{gen}.resolved.json"


# Always on (record/window.py, record/gather.py): the job's gathered windows, in the recording folder itself
# (not an attempt's): a node's metrics collector and `comm2perfetto top` look in one place for the whole run.
WINDOWS_DIR = "live"
LIVE_WINDOW_FILE = f"{WINDOWS_DIR}/window.json"  # the last gathered window, rewritten each window
STRAGGLERS_FILE = f"{WINDOWS_DIR}/stragglers.jsonl"  # straggler events, one JSON object a line
METRICS_FILE = "metrics.prom"  # in WINDOWS_DIR, or record's --metrics-dir
ON_STRAGGLER_LOG = f"{WINDOWS_DIR}/on-straggler.log"
# What the readers walking a folder leave alone in WINDOWS_DIR (none of it is a dump, log or trace).
WINDOWS_OUTPUTS = frozenset(os.path.basename(f) for f in (LIVE_WINDOW_FILE, STRAGGLERS_FILE, METRICS_FILE,
                                                          ON_STRAGGLER_LOG))


EVENT_LOG_GLOB = "rank*.events.jsonl"
FR_DUMP_GLOB = "rank*.fr*.pkl"
STACKS_GLOB = "rank*.stacks.*.json"
KINETO_GLOB = "rank*.kineto.*.json.gz"
# Everything a recording writes: what --overwrite replaces (each attempt's files, in its folder, too).
JOB_GLOB = "job.*.json"
_ATTEMPT_GLOBS = (EVENT_LOG_GLOB, FR_DUMP_GLOB, STACKS_GLOB, KINETO_GLOB, TORCH_DUMP_PREFIX + "*",
                  LIVE_DIR + "/stall.*.json")
RECORDING_GLOBS = (*_ATTEMPT_GLOBS, JOB_FILE, JOB_GLOB, STALL_VERDICT_FILE, LIVE_WINDOW_FILE, STRAGGLERS_FILE,
                   f"{WINDOWS_DIR}/{METRICS_FILE}", ON_STRAGGLER_LOG,
                   *(f"{ATTEMPT_DIR_GLOB}/{g}" for g in _ATTEMPT_GLOBS))
