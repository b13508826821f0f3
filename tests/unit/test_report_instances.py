"""The report document's per-collective samples (``collectives[].instances``), its ``groups`` and its
``world_size``: what ``compare`` reads, so that every figure stays computed once, in report/.

A 2-rank recorder-only job: three steps of 10 ms, each with one all_reduce of 4 KiB on a group described
``metrics``; rank 1 arrives 5 ms late at the one in step 2. Each call takes 1 ms on the rank that issues it
(``EventLog.call``'s ``dur_ns``), so a collective runs from the first arrival to 1 ms after the last.
"""

from __future__ import annotations

import pytest

from comm2perfetto.match import load_job
from comm2perfetto.report.document import build_report
from comm2perfetto.report.overlap import Breakdown
from comm2perfetto.report_doc import FIGURES, INSTANCE_COLUMNS, VERSION
from comm2perfetto.sources import report_json
from support.factories import T0_NS, EventLog

MS = 1_000_000
LATE_NS = 5 * MS


@pytest.fixture
def job(tmp_path):
    for rank in (0, 1):
        log = EventLog(rank=rank, world=2)
        log.group(0, "0", "default_pg", [0, 1])
        log.group(1, "1", "metrics", [0, 1])
        for step in (1, 2, 3):
            start = T0_NS + step * 10 * MS
            log.step(step, start)
            late = LATE_NS if (rank, step) == (1, 2) else 0
            log.call("all_reduce", start + MS + late, gid=1, seq=step, shapes=[[1024]], dtypes=["Float"],
                     nbytes=4096, dur_ns=MS, step=step)
        log.close(T0_NS + 40 * MS)
        log.write(tmp_path)
    return load_job([tmp_path])


def test_each_collective_is_a_sample_with_its_step(job):
    doc = build_report(job, {})
    [row] = doc["collectives"]
    columns = row["instances"]
    assert tuple(columns) == INSTANCE_COLUMNS
    assert columns["seq"] == [1, 2, 3] and columns["step"] == [1, 2, 3]
    assert columns["bytes"] == [4096] * 3
    # duration: first arrival to last completion; rank 1 is 5 ms late in step 2
    assert columns["duration_s"] == pytest.approx([1e-3, (LATE_NS + MS) * 1e-9, 1e-3])
    assert columns["arrival_skew_s"] == pytest.approx([0.0, LATE_NS * 1e-9, 0.0])
    assert columns["last_rank"][1] == 1
    # the samples add up to the row's figures, computed once
    assert len(columns["seq"]) == row["count"]
    assert sum(columns["duration_s"]) == pytest.approx(row["total_s"])
    assert columns["busbw_gbps"] == pytest.approx([a * 2 * 1 / 2 for a in columns["algbw_gbps"]])  # n = 2


def test_groups_and_world_size_name_what_compare_matches(job):
    doc = build_report(job, {})
    [row] = doc["collectives"]
    assert doc["world_size"] == 2
    assert doc["groups"][row["group_uid"]] == {"name": "1", "desc": "metrics", "ranks": [0, 1]}
    assert row["process_group"] == "metrics"


def test_steps_option_keeps_the_samples_of_those_steps(job):
    doc = build_report(job, {}, steps=(2, 3))
    [row] = doc["collectives"]
    assert row["instances"]["step"] == [2, 3]


def test_the_report_writes_and_the_saved_report_reader_reads_the_contracts_names(job):
    """report_doc declares the names once: report/ writes them, sources.report_json reads them back, in order."""
    assert tuple(Breakdown(0, 0, 0, 0, 0).as_dict()) == FIGURES
    saved = report_json.check_report(build_report(job, {}))
    assert saved["version"] == VERSION and tuple(saved["job"]) == FIGURES
    assert tuple(saved["collectives"][0]["instances"] or ()) == INSTANCE_COLUMNS


def test_every_table_puts_a_collective_in_the_same_step(tmp_path):
    """Rank 1 reaches each step 4 ms after rank 0. The all_reduce rank 0 issues 1 ms into its step 3 arrives
    while rank 1 is still in step 2: it is step 3's (where the first arrival falls, on the rank that arrived
    first), in the samples, the collectives table and the module table alike."""
    for rank in (0, 1):
        log = EventLog(rank=rank, world=2)
        log.group(0, "0", "default_pg", [0, 1])
        for step in (1, 2, 3):
            start = T0_NS + step * 10 * MS + rank * 4 * MS
            log.step(step, start)
            log.call("all_reduce", T0_NS + step * 10 * MS + MS + rank * 3 * MS, seq=step, shapes=[[4]],
                     dtypes=["Float"], nbytes=16, step=step, module="Net", pass_="backward")
        log.close(T0_NS + 40 * MS)
        log.write(tmp_path)
    doc = build_report(load_job([tmp_path]), {}, steps=(1, 2))
    [row] = doc["collectives"]
    assert row["instances"]["step"] == [1, 2] and row["count"] == 2
    assert [m["count"] for m in doc["modules"]] == [2]
