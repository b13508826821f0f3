"""The live verdict on real 2-rank gloo jobs: while rank 0 waits in an all_reduce that rank 1 has not issued
(it is in ``load_next_shard()``), ``comm2perfetto record`` prints who is to blame, writes the verdict and runs
``--on-stall``, before the job ends; again when the stall resolves (with live windows every 5 s going on). Also
as two nodes, each with its own ``record`` and folder: node 0's record names the rank that runs on node 1. The
jobs run at once (``started``)."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from support.jobs import JOB_TIMEOUT_S, kill_tree, torchrun

pytestmark = pytest.mark.integration

HANG_S = 9
STALL_AFTER = "3"

JOB = f"""
import time
import torch
import torch.distributed as dist


def load_next_shard():
    time.sleep({HANG_S})  # @away


dist.init_process_group("gloo")
rank = dist.get_rank()
dist.all_reduce(torch.ones(2))
if rank == 1:
    load_next_shard()  # @call_away
dist.all_reduce(torch.ones(2))  # @stalled
dist.barrier()  # and the job ends at once: the stall's end is told all the same
dist.destroy_process_group()
"""

# Writes each event to its own file, with the variables it was given.
HOOK = """
import json, os, sys
doc = json.load(sys.stdin)
doc["env"] = {k: os.environ.get(k) for k in ("COMM2PERFETTO_EVENT", "COMM2PERFETTO_VERDICT")}
with open(f"event.{doc['event']}.json", "w") as f:
    json.dump(doc, f)
"""


def _hook(cwd) -> str:
    (cwd / "hook.py").write_text(HOOK)
    return f"{sys.executable} hook.py"


def _check_verdict(verdict: dict, job_script: str) -> None:
    (finding,) = verdict["findings"]
    assert (verdict["status"], finding["kind"], finding["process_group"], finding["op"], finding["seq"]) == \
        ("stuck", "missing_ranks", "default_pg", "all_reduce", 2)
    assert (finding["culprit_ranks"], finding["ranks_joined"]) == ([1], [0])
    stalled = next(i for i, line in enumerate(job_script.splitlines(), 1) if "@stalled" in line)
    away = next(i for i, line in enumerate(job_script.splitlines(), 1) if "@away" in line)
    assert finding["call_sites"] == {"0": f"job.py:{stalled}"}
    assert finding["stacks"]["1"][0] == f"job.py:{away} load_next_shard"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def started(module_jobs) -> Iterator[dict[str, Any]]:
    """The module's jobs, started at once: each mostly waits HANG_S for rank 1, and their waits overlap. The
    job with the recording hook (live windows every 5 s: they go on through the hang and change nothing of the
    verdict), the job whose hook hangs or fails, and the two nodes of one job, each with its own record."""
    cwd = module_jobs.folder()
    module_jobs.write(cwd, JOB)
    hooked = module_jobs.start_in(cwd, torchrun(2), record_args=["--stall-after", STALL_AFTER, "--on-stall",
                                                                 _hook(cwd), "--live-every", "5"])
    bad_hook = 'if [ "$COMM2PERFETTO_EVENT" = stall ]; then sleep 600; else exit 3; fi'
    hanging = module_jobs.start(JOB, record_args=["--stall-after", STALL_AFTER, "--on-stall", bad_hook,
                                                  "--on-stall-timeout", "2"])
    port = _free_port()
    nodes = []
    for node in (0, 1):
        cwd = module_jobs.folder()
        module_jobs.write(cwd, JOB)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
               "--monitor-interval", "0.1", "job.py"]
        nodes.append(module_jobs.start_in(cwd, cmd, record_args=["--stall-after", STALL_AFTER,
                                                                 "--on-stall", _hook(cwd)]))
    yield {"hooked": hooked, "hanging": hanging, "nodes": nodes}
    for job in (hooked, hanging, *nodes):  # left by a test that failed before finishing it
        if job.proc.poll() is None:
            kill_tree(job.proc)


def test_verdict_and_hook_while_the_job_hangs_then_resolved(started):
    job = started["hooked"]
    cwd, script = job.cwd, job.script
    # The hook's file appears while the job still runs (wait_until fails if the job ends first).
    job.wait_until((cwd / "event.stall.json").exists, "the --on-stall event", timeout=JOB_TIMEOUT_S)
    result = job.finish()
    assert result.returncode == 0, result.explain()

    stall = json.loads((cwd / "event.stall.json").read_text())
    verdict_path = str(result.out / "stall-verdict.json")
    assert stall["env"] == {"COMM2PERFETTO_EVENT": "stall", "COMM2PERFETTO_VERDICT": verdict_path}
    _check_verdict(stall["verdict"], script)
    resolved = json.loads((cwd / "event.resolved.json").read_text())
    assert resolved["event"] == "resolved" and resolved["verdict"] == stall["verdict"]

    err = result.stderr
    assert "live verdict at stall" in err and "(the job is still running)" in err
    assert "[1] missing_ranks on default_pg: all_reduce #2" in err and "culprit: 1" in err
    assert err.count("STUCK: 1 finding") == 1
    assert "resolved: the job went on" in err
    from comm2perfetto.sources.live_window import read_window

    window = read_window(result.out / "live" / "window.json")  # gathered while rank 0 waited and rank 1 slept
    assert [r.rank for r in window.ranks] == [0, 1] and window.stragglers == ()
    # The post-mortem diagnose agrees with what was said live.
    from comm2perfetto.diagnose.diagnosis import diagnose
    from comm2perfetto.match import load_job

    after = diagnose(load_job([result.out]))
    assert [(f.kind, f.seq, f.culprit_ranks) for f in after.findings] == [("missing_ranks", 2, (1,))]


def test_a_hook_that_hangs_or_fails_never_holds_up_the_job(started):
    result = started["hanging"].finish()
    assert result.returncode == 0, result.explain()
    assert "--on-stall command killed after 2 s" in result.stderr
    assert "--on-stall command exited with status 3" in result.stderr
    verdict = json.loads((result.out / "stall-verdict.json").read_text())
    assert verdict["event"] == "resolved"


def test_two_nodes_each_with_its_own_record(started):
    jobs = started["nodes"]
    script = jobs[0].script
    node0, node1 = jobs
    node0.wait_until((node0.cwd / "event.stall.json").exists, "node 0's --on-stall event")
    results = [job.finish() for job in jobs]
    for result in results:
        assert result.returncode == 0, result.explain()
    assert sorted(p.name for p in node0.out.glob("rank*.events.jsonl")) == ["rank0.events.jsonl"]
    assert sorted(p.name for p in node1.out.glob("rank*.events.jsonl")) == ["rank1.events.jsonl"]
    for job, result in zip(jobs, results):
        event = json.loads((job.cwd / "event.stall.json").read_text())
        _check_verdict(event["verdict"], script)
        assert "culprit: 1" in result.stderr
