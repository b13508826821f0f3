"""A sample of ranks is not a broken job: profiler traces of 2 ranks of a 128-rank job (people profile a few
ranks), or dumps of some ranks read with ``--sample``. The verdict covers the ranks present, names no absent
rank as culprit, and every view says what the data cover ("traces of 2 of 128 ranks"); merge and report always
say how the clocks were aligned."""

from __future__ import annotations

import json

import pytest

from comm2perfetto.trace.check import check_trace
from support.cli import run_cli
from support.factories import steady_job
from support.kineto_fixtures import TP_GROUP, write_trace_job


@pytest.fixture
def two_of_128(tmp_path):
    folder = tmp_path / "traces"
    write_trace_job(folder, world=128, sample=[0, 1])
    return folder


def test_diagnose_covers_the_traced_ranks_and_blames_no_other(two_of_128):
    code, out, _ = run_cli("diagnose", str(two_of_128))
    assert code == 0, out
    assert out.startswith("OK: every collective matched on the ranks sampled (world size 128, traces of 2 of 128 "
                          "ranks (0, 1))\n"), out
    code, out, _ = run_cli("diagnose", str(two_of_128), "--format", "json")
    doc = json.loads(out)
    assert (code, doc["status"], doc["findings"], doc["sampled"], doc["world_size"], doc["ranks_with_data"]) == (
        0, "ok", [], "traces", 128, [0, 1])


def test_merge_and_report_say_what_the_traces_cover_and_how_the_clocks_were_aligned(two_of_128, tmp_path):
    target = tmp_path / "job.pftrace"
    code, out, _ = run_cli("merge", str(two_of_128), "-o", str(target))
    assert code == 0
    lines = out.splitlines()
    assert lines[1].startswith("  ranks: 2 of 128 (a sample: traces of ranks 0, 1); collectives: 6;"), out
    # write_trace_job's kernels of a collective end at the same true time on every rank: the clocks align exactly
    assert lines[2] == "  clocks aligned to rank 0; residual skew 0 s (6 collective ends)", out
    assert lines[3] == "  findings: none (every collective matched on the ranks sampled)", out
    trace = check_trace(target)
    processes = sorted(t.name for t in trace.tracks.values() if t.kind == "process" and t.name.startswith("rank"))
    assert processes == ["rank 0", "rank 1"]  # not 126 empty processes for the ranks nobody profiled

    code, out, _ = run_cli("report", str(two_of_128))
    assert code == 0
    head = out.splitlines()[:3]
    assert head[0].startswith("comm2perfetto report: 2 of 128 ranks (a sample: traces of ranks 0, 1), basis gpu")
    assert head[2] == "  clocks aligned to rank 0; residual skew 0 s (6 collective ends)", out
    code, out, _ = run_cli("report", str(two_of_128), "--format", "json")
    doc = json.loads(out)
    assert (doc["world_size"], doc["sampled"], doc["clock"]["samples"]) == (128, "traces", 6)
    assert doc["clock"]["method"] == {"0": "assumed", "1": "refined"}


def test_kernels_no_event_names_a_group_for_are_the_only_groups_collectives(tmp_path):
    """Traces of 2 of 128 ranks whose NCCL kernels carry no args (torch of 2023): diagnose said INCOMPLETE, "No
    process group with a collective was found", exit 1, report "collectives: none", and the HTML page drew 126
    empty rows. The kernels are the collectives of the one group each trace lists."""
    folder = tmp_path / "traces"
    write_trace_job(folder, world=128, sample=[0, 1], args=False)
    code, out, _ = run_cli("diagnose", str(folder))
    assert code == 0, out
    assert out.startswith("OK: every collective matched on the ranks sampled"), out
    assert "read as collectives of default_pg, the only group their traces' distributedInfo lists" in out, out
    assert ("a sample: the collectives of ranks 0, 1 completed and matched; the other 126 rank(s) of the job left "
            "no traces, so nothing is known of them") in " ".join(out.split()), out
    page = tmp_path / "report.html"
    code, out, _ = run_cli("report", str(folder), "--format", "json", "--plot", str(page))
    assert code == 0
    (row,) = json.loads(out)["collectives"]
    # the kernels' sizes are unknown: no bytes, not 0 B
    assert (row["op"], row["process_group"], row["group_size"], row["count"], row["bytes"]) == (
        "all_reduce", "default_pg", 128, 6, None)
    html = page.read_text()
    assert 'class="nodata"' not in html  # the untraced ranks are not drawn as 126 empty rows
    assert "world size 128 (a sample: traces of these ranks only; the others are not drawn)" in html


def test_kernels_of_traces_listing_several_groups_are_said_to_be_unmatched(tmp_path):
    """Where a trace lists several groups, a kernel naming none is no group's: diagnose says the kernels ran but
    cannot be matched, not to check that the job issued collectives."""
    folder = tmp_path / "traces"
    write_trace_job(folder, world=4, sample=[0, 1], args=False, more_groups=[TP_GROUP])
    code, out, _ = run_cli("diagnose", str(folder), "--format", "json")
    doc = json.loads(out)
    (finding,) = doc["findings"]
    assert (code, finding["kind"]) == (1, "no_collectives")
    assert finding["detail"].endswith(
        "The profiler traces of ranks 0, 1 hold 12 communication kernels, which ran, but no event names their "
        "process group and the traces list several: which collective each one is cannot be matched across ranks.")


def _dumps(tmp_path, stuck: bool = False, missing: int | None = None):
    """Dumps of ranks 0 and 1 of a 4-rank job: three completed collectives, then (``stuck``) a fourth both
    wait in, or one rank ``missing`` never issues while the other waits in it."""
    job = steady_job(world=4, steps=3)
    for r in job.ranks:
        if stuck and r != missing:
            job.collective(r, "all_reduce", [[4]], state="started", site="train.py:57")
    folder = tmp_path / "dumps"
    job.write(folder, ranks=[0, 1])
    return folder


def test_without_sample_absent_ranks_are_suspects_and_with_it_they_are_not(tmp_path):
    folder = _dumps(tmp_path)
    code, out, _ = run_cli("diagnose", str(folder), "--format", "json")
    doc = json.loads(out)
    assert (code, [(f["kind"], f["culprit_ranks"], f["suspect_ranks"]) for f in doc["findings"]], doc["sampled"]) == (
        1, [("no_dump", [], [2, 3])], None)
    code, out, _ = run_cli("diagnose", str(folder), "--sample")
    assert code == 0, out
    assert "(world size 4, data of 2 of 4 ranks (0, 1))" in out.splitlines()[0], out


def test_a_sample_stuck_in_a_collective_names_no_culprit_it_cannot_see(tmp_path):
    folder = _dumps(tmp_path, stuck=True)
    code, out, _ = run_cli("diagnose", str(folder), "--sample", "--format", "json")
    doc = json.loads(out)
    assert code == 1 and doc["status"] == "incomplete"
    (finding,) = doc["findings"]
    assert (finding["kind"], finding["seq"], finding["culprit_ranks"], finding["suspect_ranks"],
            finding["ranks_joined"]) == ("no_dump", 4, [], [], [0, 1])
    assert "not in the sample" in finding["detail"]
    assert (doc["culprit_ranks"], doc["suspect_ranks"]) == ([], [])


def test_a_sample_still_names_a_present_rank_that_never_issued_a_collective(tmp_path):
    folder = _dumps(tmp_path, stuck=True, missing=1)
    code, out, _ = run_cli("diagnose", str(folder), "--sample", "--format", "json")
    doc = json.loads(out)
    assert code == 1
    assert [(f["kind"], f["seq"], f["culprit_ranks"], f["suspect_ranks"]) for f in doc["findings"]] == [
        ("missing_ranks", 4, [1], [])]


def test_the_preview_names_a_finding_without_a_collective_by_its_kind(tmp_path, monkeypatch):
    """The preview's header printed ``no_dump: None ( seq None)`` for a finding about no collective."""
    drawn = {}

    def fake_render(path, rows, begin, end, *, title, notes):
        drawn["notes"] = notes

    monkeypatch.setattr("comm2perfetto.trace.preview.render_preview", fake_render)
    folder = _dumps(tmp_path)
    code, _, _ = run_cli("merge", str(folder), "-o", str(tmp_path / "job.pftrace"), "--preview",
                         str(tmp_path / "job.png"))
    assert code == 0
    assert drawn["notes"] == ["diagnose: incomplete", "no_dump"]
