"""Kineto (torch.profiler) traces: recognised and read without torch."""

from __future__ import annotations

import gzip
import json

import pytest
from factories import T0_NS

from comm2perfetto.sources.kineto import KinetoFormatError, read_kineto, sniff_kineto

DOC = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 8},
       "baseTimeNanoseconds": T0_NS,
       "traceEvents": [
           {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0},
           {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 7,
            "ts": 12.5, "dur": 80.25, "args": {"Collective name": "allreduce", "Seq": 5,
                                               "Process Group Name": "0"}},
           {"ph": "i", "name": "marker", "ts": 3.0}]}


@pytest.mark.parametrize("gz", [False, True])
def test_read_kineto(tmp_path, gz):
    raw = json.dumps(DOC).encode()
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(raw) if gz else raw)
    trace = read_kineto(path)
    assert (trace.rank, trace.world_size, trace.backend, trace.event_count) == (3, 8, "nccl", 3)
    (ev,) = trace.comm_events
    assert ev.t_begin_ns == T0_NS + int(12.5 * 1000) and ev.duration_ns == int(80.25 * 1000)
    assert (ev.collective, ev.seq, ev.pg_name) == ("allreduce", 5, "0")
    assert sniff_kineto(raw[:200])


def test_not_a_kineto_trace(tmp_path):
    (tmp_path / "x.json").write_text('{"entries": []}')
    with pytest.raises(KinetoFormatError, match="no traceEvents"):
        read_kineto(tmp_path / "x.json")
    (tmp_path / "y.json.gz").write_bytes(b"\x1f\x8b garbage")
    with pytest.raises(KinetoFormatError, match="not a readable Kineto trace"):
        read_kineto(tmp_path / "y.json.gz")
