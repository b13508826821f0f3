"""A trace every writer can write (``write_scenario``: two ranks and a job process, nested slices, instants,
counters, flows, a stalled slice) and what its args decode to, for the tests of each writer
(tests/unit/test_trace_perfetto.py, test_trace_chrome_json.py)."""

from __future__ import annotations

from comm2perfetto.trace.sink import TraceSink, arg_text

T0 = 1_795_313_447_000_000_000  # CLOCK_REALTIME ns of today: 9-byte varints

ARGS = {"seq": 3, "neg": -5, "zero": 0, "one": 1, "big": 2**63 + 5, "huge": 2**70, "int64_min": -(2**63),
        "ratio": 0.25, "whole_float": 2.0, "yes": True, "no": False, "pg": "default_pg", "empty": "",
        "unicode": "Größe ✓", "sizes": [[4, 4], [8]], "ranks": (0, 1), "flags": [True, 1.5, "x"]}


def expected_args(args: dict) -> dict:
    """What a trace holds for ``args``: lists as text, ints past 64 bits as their digits."""
    out = {}
    for key, value in args.items():
        value = arg_text(value)
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
            value = str(value)
        out[key] = value
    return out


def write_scenario(w: TraceSink) -> dict[str, int]:
    """Two ranks and a job process; nested slices, instants, counters, flows, a stalled slice.

    Returns the WriteStats counts this should give.
    """
    w.process(1, pid=100, name="job", description="3 ranks", sort_index=-1)
    w.process(2, pid=4242, name="rank 0", description="host a, pid 4242", sort_index=0)
    w.process(3, pid=4343, name="rank 1", description="host b, pid 4343", sort_index=1)
    w.track(10, parent=2, name="default_pg", sort_index=0, description="collectives of the default group")
    w.track(11, parent=2, name="nvtx", sort_index=1)
    w.counter_track(12, parent=2, name="bytes in flight", unit="bytes", sort_index=2)
    w.track(20, parent=3, name="default_pg", sort_index=0)
    w.counter_track(21, parent=3, name="queue", unit="requests", sort_index=1)
    w.track(30, parent=1, name="findings", sort_index=0)

    w.begin(11, T0, "step 1", {"step": 1}, category="nvtx")
    w.complete(10, T0 + 1_000, 8_000, "all_reduce", ARGS, category="collective", flow_start=(7,))
    w.complete(20, T0 + 3_000, 6_000, "all_reduce", {"seq": 3}, category="collective", flow_step=(7,))
    w.complete(10, T0 + 10_000, 500, "broadcast", {"seq": 4}, category="collective", flow_start=(8,))
    w.begin(11, T0 + 10_100, "forward", {"layer": "attn"}, category="nvtx")
    w.end(11, T0 + 20_000)
    w.end(11, T0 + 30_000)
    w.instant(30, T0 + 30_500, "missing broadcast (default_pg seq 4)", {"stack": "train.py:57 step"},
              flow_end=(7, 8))
    w.begin(20, T0 + 40_000, "all_reduce", {"seq": 5, "state": "stalled"}, category="collective")
    w.counter(12, T0 + 1_000, 16)
    w.counter(12, T0 + 9_000, 0)
    w.counter(21, T0 + 2_000, 2.5)
    return {"slices": 6, "unclosed": 1, "instants": 1, "counters": 3, "flows": 2}
