"""The one door: ``match.load_job(paths, options)``, each product's preset, and what each way of reading the
profiler traces gives. Checked on the real 4-rank recording and the public Kineto traces of tests/data."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from comm2perfetto.load_options import DIAGNOSE, MERGE, REPORT, LoadOptions, Traces
from comm2perfetto.match import load_job
from comm2perfetto.sources.kineto.reader import read_kineto, read_kineto_and_spans, read_kineto_spans
from comm2perfetto.sources.read import load_sources

DATA = Path(__file__).parents[1] / "data"
RECORDING = DATA / "recording" / "subgroups"
KINETO = sorted((DATA / "kineto").glob("*.json.gz"))


@pytest.mark.parametrize("path", [RECORDING, *KINETO], ids=lambda p: p.name)
def test_profiles_read_with_every_event_are_those_report_reads_in_workers(path):
    """merge --preview draws what report measures: the unions made in the same reading as the events (one parse of
    each file) are the worker-read ones, on the job's clock."""
    with_events = load_job([path], dataclasses.replace(MERGE, profiles=True, workers=1))
    reported = load_job([path], dataclasses.replace(REPORT, workers=2))
    assert with_events.profiles and with_events.profiles == reported.profiles
    assert with_events.traces.keys() == reported.traces.keys()


@pytest.mark.parametrize("path", KINETO, ids=lambda p: p.name)
def test_one_reading_gives_both_parsers_answers(path):
    trace, spans = read_kineto_and_spans(path)
    assert trace == read_kineto(path) and spans == read_kineto_spans(path)


def test_each_preset_reads_what_its_product_needs():
    diagnosed, reported, merged = (load_job([RECORDING], o) for o in (DIAGNOSE, REPORT, MERGE))
    assert diagnosed.resolver is not None and merged.resolver is None  # stacks on demand, or read now
    assert not diagnosed.profiles and reported.profiles.keys() == {0, 1, 2, 3} and not merged.profiles
    assert all(not t.cpu_ops and t.comm_events for ts in diagnosed.traces.values() for t in ts)  # communication only
    assert all(t.cpu_ops for ts in merged.traces.values() for t in ts)
    assert merged.paths == (str(RECORDING),) and merged.options == MERGE


def test_listed_traces_are_ranked_not_read_and_none_leaves_them_out():
    listed = load_sources([RECORDING], LoadOptions(traces=Traces.LISTED))
    assert listed.kineto.keys() == {0, 1, 2, 3} and not listed.traces and not listed.profiles
    left_out = load_job([RECORDING], LoadOptions(traces=Traces.NONE, profiles=True))
    assert not left_out.traces and not left_out.profiles and not any(i.kineto_files for i in left_out.ranks.values())


def test_another_attempt_is_read_as_the_job_was_without_stacks_or_traces():
    options = dataclasses.replace(REPORT, force=True, trace_ranks={"a.json": 3}, workers=4, sample=True, attempt=2,
                                  hta_scope=True)
    assert options.for_attempt(0) == LoadOptions(traces=Traces.NONE, stacks=False, attempt=0, force=True,
                                                 trace_ranks={"a.json": 3})
