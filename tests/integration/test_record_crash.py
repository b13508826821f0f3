"""Ranks that die without cleaning up: SIGKILL, ``os._exit`` and SIGABRT (``os.abort()``, what a C++ abort
does). Everything each rank recorded up to its death must be readable.

A small launcher starts the three ranks itself (torchrun would kill the survivors when the first one dies,
racing the other deaths), each with its own way to die once all three are past their last collective.
"""

from __future__ import annotations

import json
import signal
import sys

import pytest

pytestmark = pytest.mark.integration

LAUNCHER = """
import json, os, socket, subprocess, sys

with socket.socket() as s:  # a free port for the job's TCPStore
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
procs = []
for rank in range(3):
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="3", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port))
    procs.append(subprocess.Popen([sys.executable, "job.py"], env=env))
codes = []
for p in procs:
    try:
        codes.append(p.wait(timeout=60))
    except subprocess.TimeoutExpired:
        p.kill()
        codes.append(p.wait())
print("EXIT CODES " + json.dumps(codes), flush=True)
"""

JOB = """
import os, resource, signal
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
for i in range(4):
    t = torch.ones(i + 1)
    dist.all_reduce(t)  # @loop
    assert t.tolist() == [3.0] * (i + 1)
dist.broadcast(torch.zeros(5), src=2)  # @last
dist.barrier()  # @barrier
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file from the abort
if rank == 0:
    os.kill(os.getpid(), signal.SIGKILL)
elif rank == 1:
    os._exit(3)
else:
    os.abort()
"""


@pytest.fixture(scope="module")
def crash_job(module_jobs):
    cwd = module_jobs.folder()
    module_jobs.write(cwd, LAUNCHER, "launcher.py")
    module_jobs.write(cwd, JOB, "job.py")
    running = module_jobs.start_in(cwd, [sys.executable, "launcher.py"], record_args=["--stall-after", "30"])
    return running.finish(90)


def test_ranks_died_as_intended(crash_job):
    assert crash_job.returncode == 0, crash_job.explain()  # the launcher itself exits normally
    line = next(li for li in crash_job.stdout.splitlines() if li.startswith("EXIT CODES "))
    assert json.loads(line.removeprefix("EXIT CODES ")) == [-signal.SIGKILL, 3, -signal.SIGABRT]
    assert crash_job.job_file()["exit_status"] == 0


@pytest.mark.parametrize("rank", [0, 1, 2], ids=["sigkill", "os._exit", "sigabrt"])
def test_log_of_a_dead_rank_is_readable(crash_job, rank):
    path = crash_job.out / f"rank{rank}.events.jsonl"
    raw = path.read_bytes()
    # Never truncated: the mapping's zero padding is still there after the last record.
    assert raw.endswith(b"\0") and len(raw) % 4096 == 0
    log = crash_job.log(rank)
    assert log.closed_reason is None, "a dead rank cannot have closed its log"
    assert log.problems == [f"rank{rank}.events.jsonl: not closed cleanly (the rank died, or still runs): "
                            f"read up to its last record"]
    assert (log.rank, log.world_size) == (rank, 3)
    expected = [("all_reduce", "@loop", [[i + 1]]) for i in range(4)] + [
        ("broadcast", "@last", [[5]]), ("barrier", "@barrier", [])]
    assert [(c.op, c.site, c.shapes) for c in log.calls] == [
        (op, f"job.py:{crash_job.line_of(marker)} <module>", shapes) for op, marker, shapes in expected]
    for call in log.calls:  # every call before the death returned, and its return was recorded
        assert call.t_return_ns is not None and call.error is None
    assert [c.seq for c in log.calls] == [1, 2, 3, 4, 5, 6]
    assert log.calls[4].peer == 2
