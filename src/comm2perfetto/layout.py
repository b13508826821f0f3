"""File names in a recording folder (docs/log-format.md): the one place the recorder that writes them and
the readers that find them take them from, and how a file is written there. Never imports torch."""

from __future__ import annotations

import os


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


LIVE_DIR = ".live"  # hidden: readers walking the folder skip it
STALL_VERDICT_FILE = "stall-verdict.json"  # the latest live verdict, written by `comm2perfetto record`


def live_snapshot(gen: int) -> str:
    """Every rank's position at stall ``gen``, gathered through the store (record/live.py)."""
    return f"{LIVE_DIR}/stall.{gen}.json"


def live_resolved(gen: int) -> str:
    return f"{LIVE_DIR}/stall.{gen}.resolved.json"


EVENT_LOG_GLOB = "rank*.events.jsonl"
FR_DUMP_GLOB = "rank*.fr*.pkl"
STACKS_GLOB = "rank*.stacks.*.json"
KINETO_GLOB = "rank*.kineto.*.json.gz"
# Everything a recording writes: what --overwrite replaces.
JOB_GLOB = "job.*.json"
RECORDING_GLOBS = (EVENT_LOG_GLOB, FR_DUMP_GLOB, STACKS_GLOB, KINETO_GLOB, TORCH_DUMP_PREFIX + "*", JOB_FILE,
                   JOB_GLOB, STALL_VERDICT_FILE, LIVE_DIR + "/stall.*.json")
