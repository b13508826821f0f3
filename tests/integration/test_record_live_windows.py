"""Live windows on a real 4-rank gloo job with ``--live-every 2`` (issue 36's targets, at the shortest cadence to keep
the job short): rank 2 arriving 30 ms late at every all_reduce is named a straggler within 3 windows, and no other
rank (the on-time ranks are the job without the delay: none of them is named, each has its metrics), with metrics
labelled ``rank="2"``, ``top`` and ``--on-straggler``; afterwards ``report`` finds the same in the logs' windows.
(A job that hangs still gets its stall verdict with windows every 5 s: tests/integration/test_record_live_verdict.py;
the rule against jitter alone: tests/unit/test_lateness.py.)"""

from __future__ import annotations

import json
import sys

import pytest

from support.cli import run_cli
from support.jobs import torchrun

pytestmark = pytest.mark.integration

EVERY = "2"

# Every rank runs for RUN_S seconds; the ranks agree when to stop through the all_reduce itself (a rank that
# left the loop on its own clock would leave the others waiting in a collective it never issues).
JOB = """
import time
import torch
import torch.distributed as dist

RUN_S, DELAY_S = {run_s}, {delay_s}
dist.init_process_group("gloo")
rank = dist.get_rank()
flag = torch.zeros(256)
end = time.time() + RUN_S
while True:
    time.sleep(0.02)  # the step's work
    if rank == 2:
        time.sleep(DELAY_S)  # @late
    flag[0] = float(time.time() > end)
    dist.all_reduce(flag)
    if flag[0] > 0:
        break
dist.destroy_process_group()
"""

HOOK = """
import json, os, sys
with open("events.jsonl", "a") as f:
    f.write(json.dumps(dict(json.load(sys.stdin), env=os.environ["COMM2PERFETTO_EVENT"])) + "\\n")
"""


def _metric_ranks(text: str, name: str) -> set[str]:
    return {line.split('rank="')[1].split('"')[0] for line in text.splitlines() if line.startswith(name + "{")}


def test_a_rank_late_at_every_all_reduce_is_named_within_three_windows_and_no_other(record_job):
    cwd = record_job.folder()
    record_job.write(cwd, JOB.format(run_s=8, delay_s=0.03))
    (cwd / "hook.py").write_text(HOOK)
    result = record_job.start_in(cwd, torchrun(4), record_args=[
        "--live-every", EVERY, "--on-straggler", f"{sys.executable} hook.py"]).finish()
    assert result.returncode == 0, result.explain()

    events = [json.loads(line) for line in (result.out / "live" / "stragglers.jsonl").read_text().splitlines()]
    assert {e["rank"] for e in events} == {2}, events
    start = next(e for e in events if e["event"] == "start")
    assert (start["group"], start["group_desc"]) == ("0", "default_pg")
    assert 0.025 < start["mean_lateness_s"] < 0.2 and start["last_share"] > 0.8
    first = min(w.window for w in result.log(2).windows if w.groups)  # rank 2's first window with a collective
    assert start["window"] - first < 3, (start, first)
    assert "straggler: rank 2 on default_pg (group 0) arrives" in result.stderr
    hooked = [json.loads(line) for line in (cwd / "events.jsonl").read_text().splitlines()]
    assert [(h["env"], h["rank"], h["window"]) for h in hooked] == [
        (f"straggler-{e['event']}", e["rank"], e["window"]) for e in events]

    metrics = (result.out / "live" / "metrics.prom").read_text()
    assert _metric_ranks(metrics, "comm2perfetto_comm_calls") == {"0", "1", "2", "3"}
    assert _metric_ranks(metrics, "comm2perfetto_lateness_seconds") == {"0", "1", "2", "3"}
    straggler = [line for line in metrics.splitlines() if line.startswith("comm2perfetto_straggler{")]
    assert [line.split('rank="')[1][0] for line in straggler if line.endswith(" 1")] == ["2"]

    table = run_cli("top", result.out, "--once").out.splitlines()
    assert table[1] == "stragglers: rank 2 on default_pg"
    assert table[4].split()[0] == "2"  # first row: the straggler

    # Afterwards, from the logs alone: the same rank late, window after window, and the same episode.
    live = run_cli("report", result.out, "--format", "json").json()["live"]
    (group,) = live["groups"]
    late = {rank: [v for v in verdicts if v is not None] for rank, verdicts in zip(group["ranks"], group["late"])}
    assert sum(late[2]) >= 2, late
    # Another rank may be late in one window (a hiccup on a loaded machine: seen in CI, rank 0 in the first
    # window); a straggler must be late in 2 of 3, and none other is.
    assert all(sum(late[r][i:i + 3]) < 2 for r in (0, 1, 3) for i in range(len(late[r]))), late
    assert [(e["event"], e["rank"]) for e in live["stragglers"]][:1] == [("start", 2)]
    assert {e["rank"] for e in live["stragglers"]} == {2}, live["stragglers"]
