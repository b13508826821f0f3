"""Groups whose backend c10d does not call ``gloo`` although gloo runs their calls: ``init_process_group()``
with no backend (c10d says ``undefined``) and ``init_process_group("cpu:gloo")``, real 2-rank jobs recorded by
``comm2perfetto record``. A synchronous call on CPU tensors is complete when it returns, whatever the
backend's name: every collective gets a duration, in the merged job and in the report.
(``init_device_mesh("cpu")``, the TP example, is checked in test_record_dtensor.py.)
"""

from __future__ import annotations

import json

import pytest

from support.cli import run_cli_process

pytestmark = pytest.mark.integration

JOB = """
import torch
import torch.distributed as dist

dist.init_process_group({backend})
rank = dist.get_rank()
t = torch.ones(4)
dist.all_reduce(t)
dist.broadcast(t, src=0)
dist.all_gather_into_tensor(torch.zeros(8), t)
dist.barrier()
objects = [None, None]
dist.all_gather_object(objects, rank)
dist.destroy_process_group()
"""

# the job's collectives per rank, op -> count (all_gather_object is two all_gathers, of sizes and of data)
COLLECTIVES = {"all_reduce": 1, "broadcast": 1, "all_gather_into_tensor": 1, "barrier": 1, "all_gather_object": 1}


@pytest.mark.parametrize(("backend", "reported"), [("", "undefined"), ('"cpu:gloo"', "cpu:gloo")],
                         ids=["no-backend", "cpu-gloo"])
def test_every_synchronous_call_is_timed(record_job, backend, reported):
    job = record_job.run(JOB.format(backend=backend))
    assert job.returncode == 0, job.explain()
    for rank in (0, 1):
        log = job.log(rank)
        group = log.groups[0]
        assert (group.backend, group.devices) == (reported, {"cpu": "gloo"})
        assert {c.op for c in log.calls} == set(COLLECTIVES)
        assert all(group.completes_on_return(c) for c in log.calls)

    from comm2perfetto.match import load_job

    collectives = list(load_job([job.out]).iter_collectives())
    # all_gather_object is two collectives (sizes, then data)
    assert len(collectives) == sum(COLLECTIVES.values()) + 1
    for c in collectives:
        assert c.completed_everywhere, c
        for rank in (0, 1):
            part = c.part(rank)
            assert part is not None and part.t_end_ns is not None and part.t_end_ns >= part.t_arrive_ns, c

    proc = run_cli_process("report", str(job.out), "--format", "json", timeout=60)
    assert proc.code == 0, proc.err
    rows = json.loads(proc.out)["collectives"]
    assert rows and all(r["timed"] == r["count"] and r["total_s"] > 0 for r in rows), rows
