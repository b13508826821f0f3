"""Opt-in: a real trace_processor reads what the writers write, and SQL finds what was written.

Set ``COMM2PERFETTO_TRACE_PROCESSOR`` to a ``trace_processor_shell`` binary (https://get.perfetto.dev/
trace_processor) to run these; each query runs as ``trace_processor_shell -q QUERY_FILE TRACE`` (CSV out).
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
from pathlib import Path

import pytest

from comm2perfetto.trace.chrome_json import ChromeJsonWriter
from comm2perfetto.trace.perfetto import PerfettoWriter

BINARY = os.environ.get("COMM2PERFETTO_TRACE_PROCESSOR")
pytestmark = pytest.mark.skipif(
    not BINARY, reason="COMM2PERFETTO_TRACE_PROCESSOR is not set to a trace_processor_shell binary (none is "
                       "installed here, and the perfetto package's downloader needs the network)")

T0 = 1_795_313_447_000_000_000
RANKS = 3
COLLECTIVES = 4


def query(trace: Path, sql: str) -> list[dict[str, str]]:
    sql_file = trace.with_suffix(".sql")
    sql_file.write_text(sql)
    done = subprocess.run([BINARY, "-q", str(sql_file), str(trace)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    rows = [row for row in csv.reader(io.StringIO(done.stdout)) if row]
    header, *body = rows
    return [dict(zip(header, row)) for row in body]


def write(path: Path, writer) -> dict:
    """Per rank: a process, a collectives track, a counter; one flow per collective through every rank; the last
    rank's last collective stalled. Returns what the trace should hold."""
    slices, counters = [], []
    writer.process(1, pid=1, name="job", sort_index=-1)
    for rank in range(RANKS):
        writer.process(10 + rank, pid=1000 + rank, name=f"rank {rank}", sort_index=rank)
        writer.track(100 + rank, parent=10 + rank, name="default_pg", sort_index=0)
        writer.counter_track(200 + rank, parent=10 + rank, name="bytes in flight", unit="bytes", sort_index=1)
    for seq in range(COLLECTIVES):
        for rank in range(RANKS):  # rank order is arrival order: the flow runs rank 0 -> last rank
            ts = T0 + seq * 1_000_000 + rank * 1_000
            flow = (seq + 1,)
            roles = {"flow_start": flow} if rank == 0 else {"flow_end": flow} if rank == RANKS - 1 else \
                {"flow_step": flow}
            args = {"seq": seq, "pg": "default_pg", "bytes": 4096 * (seq + 1)}
            if rank == RANKS - 1 and seq == COLLECTIVES - 1:
                writer.begin(100 + rank, ts, "all_reduce", dict(args, state="stalled"), category="collective",
                             **roles)
                slices.append((f"rank {rank}", ts, -1, seq))
            else:
                writer.complete(100 + rank, ts, 500_000, "all_reduce", args, category="collective", **roles)
                slices.append((f"rank {rank}", ts, 500_000, seq))
            writer.counter(200 + rank, ts, 4096 * (seq + 1))
            counters.append((f"rank {rank}", ts, 4096 * (seq + 1)))
    writer.instant(1, T0 + COLLECTIVES * 1_000_000, "job done")
    writer.close()
    return {"slices": sorted(slices), "counters": sorted(counters), "flows": COLLECTIVES * (RANKS - 1)}


@pytest.mark.parametrize("kind", ["pftrace", "json"])
def test_trace_processor_reads_what_was_written(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"t.{kind}"
    if kind == "pftrace":
        expected = write(path, PerfettoWriter(path, compress=True, realtime_anchor_ns=T0))
        arg = "debug.seq"
    else:
        expected = write(path, ChromeJsonWriter(path, time_origin_ns=T0))
        arg = "args.seq"
    origin = 0 if kind == "pftrace" else T0  # JSON times are relative to its time_origin_ns

    errors = query(path, "select name, idx, value from stats where severity in ('error', 'data_loss') "
                         "and value > 0")
    assert errors == []

    rows = query(path, f"""
        select p.name as process, s.ts, s.dur, extract_arg(s.arg_set_id, '{arg}') as seq
        from slice s join thread_track tt on s.track_id = tt.id join thread using (utid) join process p using (upid)
        where s.name = 'all_reduce'
        union all
        select p.name as process, s.ts, s.dur, extract_arg(s.arg_set_id, '{arg}') as seq
        from slice s join process_track pt on s.track_id = pt.id join process p using (upid)
        where s.name = 'all_reduce'
        order by process, s.ts""")
    assert sorted((r["process"], int(r["ts"]) + origin, int(r["dur"]), int(r["seq"])) for r in rows) == \
        expected["slices"]

    assert int(query(path, "select count(*) as n from flow")[0]["n"]) == expected["flows"]

    processes = query(path, "select pid, name, extract_arg(arg_set_id, 'process_sort_index_hint') as hint "
                            "from process where name is not null order by pid")
    assert [(int(r["pid"]), r["name"], int(r["hint"])) for r in processes] == \
        [(1, "job", -1)] + [(1000 + r, f"rank {r}", r) for r in range(RANKS)]

    counters = query(path, """
        select p.name as process, c.ts, c.value from counter c
        join process_counter_track t on c.track_id = t.id join process p using (upid)
        order by process, c.ts""")
    assert sorted((r["process"], int(r["ts"]) + origin, int(float(r["value"]))) for r in counters) == \
        expected["counters"]
