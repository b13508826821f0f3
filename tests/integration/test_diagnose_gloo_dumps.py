"""diagnose on real gloo Flight Recorder dumps (pickle and JSON) written by torch itself, no recorder.

torchfrtrace cannot read these (gloo's pg_config does not name the groups its entries use: KeyError).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from comm2perfetto.diagnose.diagnosis import diagnose
from comm2perfetto.match import load_job
from support.jobs import job_env
from support.torch_features import needs_gloo_flight_recorder

pytestmark = [pytest.mark.integration, needs_gloo_flight_recorder()]

# Two ranks do a healthy mix of collectives (default group, a new group, p2p, coalesced) and dump; then rank 0
# starts an all-reduce rank 1 never joins, both dump again, and exit without waiting.
SCRIPT = textwrap.dedent('''
    import os, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp

    def dump(out, rank):
        os.makedirs(out, exist_ok=True)
        with open(f"{out}/comm_lib_trace_rank_{rank}", "wb") as f:
            f.write(torch._C._distributed_c10d._dump_fr_trace())
        with open(f"{out}/trace-host-a_rank{rank}.json", "wb") as f:
            f.write(torch._C._distributed_c10d._dump_fr_trace_json())

    def main(rank, out, port):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=2)
        t = torch.ones(4)
        dist.all_reduce(t)
        sub = dist.new_group([0, 1], group_desc="tp")
        dist.broadcast(t, 0, group=sub)
        if rank == 0:
            dist.send(t, 1)
        else:
            dist.recv(t, 0)
        dist.all_gather_into_tensor(torch.empty(8), t)
        dist.barrier()
        dump(f"{out}/healthy", rank)
        dist.barrier()
        if rank == 0:
            dist.all_reduce(t, async_op=True)  # rank 1 never joins: the hang
        dump(f"{out}/missing", rank)
        dist.barrier(group=sub)
        os._exit(0)

    if __name__ == "__main__":
        import socket
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        mp.spawn(main, args=(sys.argv[1], port), nprocs=2)
''')


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gloo")
    script = out / "make_dumps.py"
    script.write_text(SCRIPT)
    # Flight Recorder is on by default from torch 2.11; 2.8 to 2.10 record only with a buffer size set.
    proc = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=120,
                          env=job_env(TORCH_FR_BUFFER_SIZE="2000"))
    assert (out / "missing" / "comm_lib_trace_rank_1").exists(), proc.stderr
    return out


def test_healthy_gloo_dumps(dumps):
    job = load_job([dumps / "healthy"])
    d = diagnose(job)
    assert d.status == "ok", [f.detail for f in d.findings]
    assert sorted(g.label for g in job.groups.values()) == ["default_pg", "tp"]
    seqs = [c.seq for c in job.collectives["0[0,1]"]]
    # all_reduce, all_gather_into_tensor, barrier: send/recv take no collective seq in Flight Recorder.
    assert seqs == [1, 2, 3]


@pytest.mark.parametrize("only", ["comm_lib_trace_rank_", "trace-host-a_rank"])
def test_rank_that_never_joined_is_named_from_pickle_or_json(dumps, only, tmp_path):
    for path in (dumps / "missing").iterdir():
        if path.name.startswith(only):
            (tmp_path / path.name).write_bytes(path.read_bytes())
    d = diagnose(load_job([tmp_path]))
    (f,) = d.findings
    assert (d.status, f.kind, f.process_group, f.seq, f.op) == ("stuck", "missing_ranks", "default_pg", 5,
                                                                "all_reduce")
    assert (f.ranks_joined, f.culprit_ranks) == ((0,), (1,))
    if only.startswith("comm_lib"):  # pickles carry frames: the call site is the script's line
        line = next(i for i, text in enumerate(SCRIPT.splitlines(), 1) if "the hang" in text)
        assert f.call_sites == {0: f"make_dumps.py:{line}"}


def test_json_and_pickle_dumps_of_one_job_read_together(dumps):
    d = diagnose(load_job([dumps / "missing"]))
    assert [f.kind for f in d.findings] == ["missing_ranks"]
    assert json.loads(json.dumps(d.to_json()))["findings"][0]["culprit_ranks"] == [1]
