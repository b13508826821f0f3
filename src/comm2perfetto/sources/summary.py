"""What a recording holds, in a few counts: the closing lines of ``comm2perfetto record``.

Reads each rank's event log and Flight Recorder dumps (snapshots deduplicated by record) and counts ops, so
a user sees at once that DDP's C++-issued all-reduces were captured even though the patch layer saw none.
"""

from __future__ import annotations

import glob
import os
from collections import Counter
from dataclasses import dataclass, field

from comm2perfetto import layout
from comm2perfetto.sources.event_log import EventLogError, read_event_log
from comm2perfetto.sources.fr.dump import (
    FrFormatError,
    rank_from_name,
    read_fr_dump,
    split_profiling_name,
)
from comm2perfetto.sources.limits import count_ok


@dataclass
class RecordingSummary:
    ranks: int = 0
    calls: Counter = field(default_factory=Counter)  # op -> recorded torch.distributed calls, all ranks
    cpp_calls: Counter = field(default_factory=Counter)  # op -> C++-issued collectives the dispatcher fallback saw
    fr_entries: Counter = field(default_factory=Counter)  # op -> Flight Recorder entries, all ranks
    fr_files: int = 0
    stack_files: int = 0
    profiler_traces: int = 0
    stalls: int = 0  # stalls these ranks detected themselves
    remote_stalls: int = 0  # stack dumps another rank (maybe on another node) asked these ranks for
    unreadable: list[str] = field(default_factory=list)


def summarize(out_dir: str, max_ranks: int = 64) -> RecordingSummary:
    """Count what ``out_dir`` holds. Beyond ``max_ranks`` ranks only files are counted (reading them all
    would make the end of a big job wait)."""
    def files(pattern: str) -> list[str]:
        return sorted(glob.glob(os.path.join(out_dir, pattern)))

    logs = files(layout.EVENT_LOG_GLOB)
    fr = files(layout.FR_DUMP_GLOB)
    summary = RecordingSummary(ranks=len(logs), fr_files=len(fr), stack_files=len(files(layout.STACKS_GLOB)),
                               profiler_traces=len(files(layout.KINETO_GLOB)))
    if len(logs) > max_ranks:
        return summary
    for path in logs:
        try:
            log = read_event_log(path)
        except EventLogError as exc:
            summary.unreadable.append(str(exc))
            continue
        summary.calls.update(call.op for call in log.calls if not call.from_cpp)
        summary.cpp_calls.update(call.op for call in log.calls if call.from_cpp)
        summary.stalls += sum(1 for stall in log.stalls if stall.reason != "remote")
        summary.remote_stalls += sum(1 for stall in log.stalls if stall.reason == "remote")
    seen: set[tuple[int | None, int, object]] = set()
    for path in fr:
        try:
            dump = read_fr_dump(path)
        except FrFormatError as exc:
            summary.unreadable.append(str(exc))
            continue
        rank = rank_from_name(os.path.basename(path))
        for entry in dump.entries:
            key = (rank, entry.get("pg_id", 0), entry.get("record_id"))
            if not all(x is None or count_ok(x) for x in key[1:]):
                continue  # not an entry diagnose would count either
            if key in seen:
                continue  # the same entry in an earlier snapshot of the ring
            seen.add(key)
            name = entry.get("profiling_name")
            summary.fr_entries[split_profiling_name(name if isinstance(name, str) else "")[1]] += 1
    return summary


def stacks_text(summary: RecordingSummary) -> str:
    """``"2 stall stack dumps (1 stall detected by these ranks, 1 dump asked for by another rank)"``: a node
    whose ranks only answered another node's stall has dumps but detected none itself."""
    text = _plural(summary.stack_files, "stall stack dump")
    if not summary.stack_files:
        return text
    return (f"{text} ({_plural(summary.stalls, 'stall')} detected by these ranks, "
            f"{_plural(summary.remote_stalls, 'dump')} asked for by another rank)")


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def counts_text(counter: Counter) -> str:
    """``"120 (all_reduce 80, broadcast 40)"``, most frequent first, then by name."""
    total = sum(counter.values())
    if not total:
        return "0"
    ordered = sorted(counter.items(), key=lambda item: (-item[1], item[0]))
    return f"{total} (" + ", ".join(f"{op} {n}" for op, n in ordered) + ")"
