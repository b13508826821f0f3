"""NVTX mirroring in a real 2-rank gloo job: ranges opened with the ``nvtx`` package (``annotate`` as context
manager and decorator, ``push_range``/``pop_range``, ``mark``) and with ``comm2perfetto.range`` (context
manager and decorator) become ``r``/``q`` records, and collectives inside them carry their names."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

JOB = """
import nvtx
import torch
import torch.distributed as dist
import comm2perfetto


@nvtx.annotate("decorated_nvtx")
def nvtx_decorated():
    dist.all_reduce(torch.ones(1))  # @in_nvtx_decorator


@comm2perfetto.range("decorated_c2p")
def c2p_decorated():
    dist.all_reduce(torch.ones(2))  # @in_c2p_decorator
    return "value"


dist.init_process_group("gloo")
with nvtx.annotate("outer_nvtx"):
    nvtx.push_range("pushed")
    with comm2perfetto.range("inner_c2p"):
        dist.all_reduce(torch.ones(3))  # @innermost
    nvtx.pop_range()
    nvtx_decorated()
assert c2p_decorated() == "value"
nvtx.push_range("default_a")
nvtx.push_range("io", domain="data")
nvtx.pop_range()  # NVTX pops per domain: this closes default_a, not io
dist.all_reduce(torch.ones(5))  # @in_data_domain
nvtx.pop_range(domain="data")
nvtx.mark("a_mark")
dist.all_reduce(torch.ones(4))  # @outside
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def nvtx_job(module_jobs):
    job = module_jobs.run(JOB, record_args=["--stall-after", "30"])
    assert job.returncode == 0, job.explain()
    return job


def _contains(outer, inner) -> bool:
    return outer.t_begin_ns <= inner.t_begin_ns and inner.t_end_ns <= outer.t_end_ns


@pytest.mark.parametrize("rank", [0, 1])
def test_ranges_are_recorded_and_nested(nvtx_job, rank):
    log = nvtx_job.log(rank)
    assert log.closed_reason == "exit" and log.problems == []
    ranges = {r.name: r for r in log.ranges}
    assert [(r.name, r.source) for r in log.ranges] == [
        ("outer_nvtx", "nvtx"), ("pushed", "nvtx"), ("inner_c2p", "c2p"), ("decorated_nvtx", "nvtx"),
        ("decorated_c2p", "c2p"), ("default_a", "nvtx"), ("io", "nvtx"),
    ]
    assert [r.name for r in log.ranges if r.domain == "data"] == ["io"]
    for r in log.ranges:
        assert r.t_end_ns is not None and r.t_end_ns >= r.t_begin_ns, r.name
        assert r.tid == log.calls[0].tid  # all on the main thread
    assert _contains(ranges["outer_nvtx"], ranges["pushed"])
    assert _contains(ranges["pushed"], ranges["inner_c2p"])
    assert _contains(ranges["outer_nvtx"], ranges["decorated_nvtx"])
    assert ranges["pushed"].t_end_ns <= ranges["decorated_nvtx"].t_begin_ns
    assert ranges["outer_nvtx"].t_end_ns <= ranges["decorated_c2p"].t_begin_ns
    ((_t, name, tid, source),) = log.marks
    assert (name, tid, source) == ("a_mark", log.calls[0].tid, "nvtx")
    assert ranges["default_a"].t_end_ns < ranges["io"].t_end_ns <= _t


@pytest.mark.parametrize("rank", [0, 1])
def test_collectives_carry_their_enclosing_ranges(nvtx_job, rank):
    log = nvtx_job.log(rank)
    by_line = {c.site: c for c in log.calls}
    expected = {
        "@innermost": ("outer_nvtx", "pushed", "inner_c2p"),
        "@in_nvtx_decorator": ("outer_nvtx", "decorated_nvtx"),
        "@in_c2p_decorator": ("decorated_c2p",),
        "@in_data_domain": ("io",),
        "@outside": (),
    }
    funcs = {"@innermost": "<module>", "@in_nvtx_decorator": "nvtx_decorated",
             "@in_c2p_decorator": "c2p_decorated", "@in_data_domain": "<module>", "@outside": "<module>"}
    assert len(log.calls) == len(expected)
    ranges = {r.name: r for r in log.ranges}
    for marker, names in expected.items():
        call = by_line[f"job.py:{nvtx_job.line_of(marker)} {funcs[marker]}"]
        assert call.nvtx == names, marker
        for name in names:  # and in time, the call lies inside each of them
            assert ranges[name].t_begin_ns <= call.t_call_ns <= call.t_return_ns <= ranges[name].t_end_ns
