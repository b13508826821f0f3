"""The fault matrix: real gloo jobs (plain collectives and DDP, 2 and 3 ranks) with injected faults, each
checked for diagnose's exact status, finding kind and culprit.

Faults: SIGKILL of each rank at several points (before its first collective, mid-job, after its last one),
SIGINT/SIGTERM to ``comm2perfetto record`` while healthy and while hung (torchrun and a
``bash -c 'python & python & wait'`` launcher), a job diagnosed while it still runs, and views of recordings a
user brings: one node's folder alone, dumps holding no entries, dumps cut in half, two jobs mixed, the same
path given twice, a two-node job recorded by one ``record`` per node. One recorded job serves several
assertions where it honestly can (the running job is then interrupted; the hung job's rank 0 folder is the
"one node" view). Then the shapes of real training jobs (issue 21: several groups and a device mesh, pipeline
and batched p2p, a broadcast root, frozen ranks, an early exit, a late rank), each checked for diagnose's
verdict and the live verdict file's. docs/reliability.md reports these figures.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from comm2perfetto.processes import process_state
from comm2perfetto.sources.event_log import read_event_log, read_header
from support.cli import run_cli_process
from support.jobs import JobResult, RunningJob, job_env, record_cmd, torchrun
from support.torch_features import gloo_flight_recorder, needs_gloo_flight_recorder
from support.verdicts import diagnose, verdict

pytestmark = pytest.mark.integration

# MODE plain: one all_reduce a step; ddp: a DDP step (its all_reduces are issued from C++).
# KILL=r:s SIGKILLs rank r at step s (s == STEPS: after its last collective); HANG=r:s makes rank r sleep there.
JOB = """
import gc
import os, signal, sys, time
from pathlib import Path
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
mode, steps, pause = os.environ["MODE"], int(os.environ["STEPS"]), float(os.environ.get("PAUSE", "0.01"))

def fault(env):
    r, s = (os.environ.get(env) or "-1:-1").split(":")
    return int(s) if int(r) == rank else None

kill_at, hang_at = fault("KILL"), fault("HANG")
if mode == "ddp":
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
t = torch.ones(16)
for step in range(steps + 1):
    if step == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    if step == hang_at:
        time.sleep(600)
    if step == steps:
        break
    if mode == "ddp":
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    else:
        dist.all_reduce(t)  # @loop
    if step == 3:
        Path(f"step3-rank{rank}").touch()
    time.sleep(pause)
dist.barrier()  # @end
dist.destroy_process_group()
if mode == "ddp":
    del model, opt  # DDP's reference cycles hold the gloo group: freed while Python is whole (examples/ddp_train.py)
    gc.collect()
"""

LONG = "100000"  # steps of a job that runs until it is signalled


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bash_launcher(nproc: int) -> list[str]:
    """What people write without torchrun: every rank in the background of one shell, then ``wait``."""
    ranks = " ".join(f"RANK={r} LOCAL_RANK={r} {sys.executable} job.py &" for r in range(nproc))
    return ["bash", "-c", f"export WORLD_SIZE={nproc} MASTER_ADDR=127.0.0.1 MASTER_PORT={_free_port()}; "
                          f"{ranks} wait"]


def start(runner, *, mode: str, nproc: int = 2, steps: str = "8", launcher: str = "torchrun",
          record_args: tuple[str, ...] = ("--stall-after", "30"), **env: str) -> RunningJob:
    cwd = runner.folder()
    runner.write(cwd, JOB)
    job = torchrun(nproc) if launcher == "torchrun" else bash_launcher(nproc)
    return runner.start_in(cwd, job, record_args=record_args, env=dict(MODE=mode, STEPS=steps, **env))


def interrupt(running: RunningJob, signum: int) -> JobResult:
    running.proc.send_signal(signum)  # to `comm2perfetto record`, as a terminal's Ctrl-C or a scheduler does
    return running.finish(90)


def no_process_left(job: JobResult) -> bool:
    """None of the job's ranks outlived `record` (their pids are in the logs' headers)."""
    for log in job.out.glob("rank*.events.jsonl"):
        pid = json.loads(log.read_text().split("\n", 1)[0])["pid"]
        try:
            Path(f"/proc/{pid}").stat()
            return False
        except FileNotFoundError:
            continue
    return True


# --- a rank SIGKILLed: crashed, rank_died, culprit that rank -------------------------------------------------

KILLS = [
    # (mode, ranks, launcher, KILL, expected findings): the others wait in, or fail at, the next collective
    pytest.param("plain", 2, "bash", "0:0", [("rank_died", 1, [0])], id="plain-rank0-before-first-collective"),
    pytest.param("plain", 2, "bash", "1:4", [("rank_died", 5, [1])], id="plain-rank1-mid-job"),
    pytest.param("plain", 3, "bash", "2:8", [("rank_died", 9, [2])], id="plain-rank2-after-last-collective"),
    pytest.param("ddp", 2, "torchrun", "1:25", [("rank_died", None, [1])], id="ddp-rank1-step25"),
    pytest.param("ddp", 2, "torchrun", "0:3", [("rank_died", None, [0])], id="ddp-rank0-step3"),
]


@pytest.mark.parametrize("mode, nproc, launcher, kill, expected", KILLS)
def test_killed_rank_is_the_culprit(record_job, mode, nproc, launcher, kill, expected):
    steps = "30" if mode == "ddp" else "8"
    job = start(record_job, mode=mode, nproc=nproc, steps=steps, launcher=launcher, KILL=kill).finish(90)
    assert job.returncode != 0 or launcher == "bash", job.explain()  # bash's `wait` says 0 whatever happened
    if mode == "ddp" and not gloo_flight_recorder():
        # Torch 2.4-2.7: the dispatcher fallback recorded the survivor's gradient all-reduce of the step the other
        # rank died in, and the finding names it (gloo's Flight Recorder entries, on newer torch, do not).
        (survivor,) = set(range(nproc)) - set(expected[0][2])
        step = int(kill.split(":")[1])
        (seq,) = [c.seq for c in job.log(survivor).calls if c.from_cpp and c.op == "all_reduce" and c.step == step]
        expected = [(kind, seq, ranks) for kind, _none, ranks in expected]
    code, doc = diagnose(job.out)
    killed_rank = expected[0][2][0]
    unseen = _stopped_unseen(job, killed_rank) if launcher == "torchrun" else []
    # torchrun stopped a survivor before gloo's error reached it and reaped it before `record` read how it ended:
    # the launcher or a fault of its own cannot be told, and it is a suspect beside the culprit.
    expected += [("rank_died", None, []) for _ in unseen]
    assert (code, *verdict(doc)) == (1, "crashed", expected), doc
    died = doc["findings"][0]
    victims = set(range(nproc)) - set(died["culprit_ranks"])
    assert {int(r) for r in died["evidence"].get("failed", {})} <= victims
    assert [f["suspect_ranks"] for f in doc["findings"][1:]] == [[r] for r in unseen]
    if mode == "ddp":
        assert died["evidence"]["step"] == int(kill.split(":")[1])  # the step it died in
    if launcher == "torchrun":  # record saw the killed rank end before the others, by SIGKILL (torchrun reaps late)
        exits = {e["rank"]: e for e in job.job_file()["exits"]}
        assert died["evidence"]["exit"]["signal"] in ("SIGKILL", None)
        assert all(exits[killed_rank]["t_ns"] < e["alive_ns"] for r, e in exits.items() if r != killed_rank), exits


def _stopped_unseen(job: JobResult, killed_rank: int) -> list[int]:
    """The ranks other than ``killed_rank`` whose log stops with no error of theirs and whose way of ending
    `record` did not see (the launcher reaped them first)."""
    exits = {e["rank"]: e for e in job.job_file()["exits"]}
    out = []
    for rank, e in sorted(exits.items()):
        log = job.log(rank)
        if rank != killed_rank and not log.closed_cleanly and not log.endings and e["signal"] is None \
                and e["status"] is None:
            out.append(rank)
    return out


# --- interrupted: healthy jobs stopped by a signal to `record` -------------------------------------------------


@pytest.fixture(scope="module")
def running_then_interrupted(module_jobs):
    """A healthy 2-rank job diagnosed while it runs, then stopped with SIGINT (Ctrl-C) to `record`."""
    running = start(module_jobs, mode="plain", steps=LONG)
    running.wait_for("step3-rank1")
    time.sleep(1.0)
    live = diagnose(running.out)
    return live, interrupt(running, signal.SIGINT)


def test_job_still_running_is_running(running_then_interrupted):
    (code, doc), _job = running_then_interrupted
    assert (code, *verdict(doc)) == (0, "running", []), doc


def test_ctrl_c_of_a_healthy_job_is_interrupted(running_then_interrupted):
    _live, job = running_then_interrupted
    assert job.job_file()["signal"] == "SIGINT"
    code, doc = diagnose(job.out)
    assert (code, *verdict(doc)) == (0, "interrupted", []), doc
    assert no_process_left(job)


@pytest.mark.parametrize("mode, nproc, launcher, signum", [
    pytest.param("ddp", 2, "torchrun", signal.SIGTERM, id="ddp-sigterm"),
    pytest.param("plain", 3, "bash", signal.SIGTERM, id="bash-launcher-sigterm"),
    pytest.param("plain", 2, "bash", signal.SIGINT, id="bash-launcher-sigint"),
])
def test_signal_to_record_of_a_healthy_job_is_interrupted(record_job, mode, nproc, launcher, signum):
    running = start(record_job, mode=mode, nproc=nproc, steps=LONG, launcher=launcher)
    running.wait_for(f"step3-rank{nproc - 1}")
    job = interrupt(running, signum)
    assert no_process_left(job), "a rank outlived record"  # the whole process group got it
    assert job.job_file()["signal"] == signal.Signals(signum).name
    code, doc = diagnose(job.out)
    if mode == "ddp" and signum == signal.SIGTERM:
        # SIGTERM ends a rank at once (the recorder leaves its default action alone: a handler would keep a rank
        # blocked in gloo alive until SIGKILL), so DDP's C++-issued collectives, only in Flight Recorder, were
        # never dumped: nothing shows them done, and the verdict does not pretend otherwise.
        assert (code, *verdict(doc)) == (1, "incomplete", [("no_collectives", None, [])]), doc
        assert "forwarded SIGTERM to the job before any Flight Recorder dump" in doc["findings"][0]["detail"]
    else:
        assert (code, *verdict(doc)) == (0, "interrupted", []), doc
    # Nothing was written after record returned: the ranks were gone.
    sizes = {p: p.stat().st_size for p in job.out.iterdir()}
    time.sleep(1.0)
    assert sizes == {p: p.stat().st_size for p in job.out.iterdir()}


# --- a real hang: stuck while it runs, still stuck after Ctrl-C; node 0's folder alone ------------------------


def _stalled(out: Path) -> bool:
    from comm2perfetto.sources.event_log import EventLogError, read_event_log

    try:
        return bool(read_event_log(out / "rank0.events.jsonl").stalls)
    except EventLogError:  # not created yet, or created and its header not written yet
        return False


@pytest.fixture(scope="module")
def hung_then_interrupted(module_jobs):
    """Rank 1 goes away before all_reduce #5; once the recorder saw the stall, diagnose it live, then SIGINT."""
    running = start(module_jobs, mode="plain", steps="8", record_args=("--stall-after", "2"), HANG="1:4")
    running.wait_until(lambda: _stalled(running.out), "the stall")
    time.sleep(1.0)
    live = diagnose(running.out)
    return live, interrupt(running, signal.SIGINT)


def test_hang_diagnosed_while_running_is_stuck(hung_then_interrupted):
    (code, doc), _job = hung_then_interrupted
    assert (code, *verdict(doc)) == (1, "stuck", [("missing_ranks", 5, [1])]), doc


def test_hang_then_ctrl_c_is_still_the_hang(hung_then_interrupted):
    _live, job = hung_then_interrupted
    code, doc = diagnose(job.out)
    assert (code, *verdict(doc)) == (1, "stuck", [("missing_ranks", 5, [1])]), doc
    assert doc["findings"][0]["ranks_joined"] == [0]


def test_one_node_folder_alone_names_the_absent_rank(hung_then_interrupted, tmp_path):
    """What node 0 holds of a job whose rank 1 ran on another node: rank 0's files only."""
    _live, job = hung_then_interrupted
    node0 = tmp_path / "node0"
    node0.mkdir()
    for p in job.out.glob("rank0.*"):
        shutil.copy(p, node0)
    code, doc = diagnose(node0)
    assert (code, *verdict(doc)) == (1, "incomplete", [("no_dump", 5, [])]), doc
    assert doc["suspect_ranks"] == [1]  # nothing shows what rank 1 did: a suspect, not a culprit by guess


# --- what users bring: partial, empty, truncated, mixed, repeated -------------------------------------------


@pytest.fixture(scope="module")
def healthy3(module_jobs):
    """A healthy 3-rank job that ends by itself."""
    job = start(module_jobs, mode="plain", nproc=3, steps="6").finish(90)
    assert job.returncode == 0, job.explain()
    return job


def test_healthy_job_is_ok_and_the_same_path_twice_is_read_once(healthy3):
    assert verdict(diagnose(healthy3.out)[1]) == ("ok", [])
    code, doc = diagnose(healthy3.out, str(healthy3.out) + "/")
    assert (code, *verdict(doc)) == (0, "ok", []), doc


def _plain_dumps(job: JobResult, dest: Path, ranks, edit=None) -> Path:
    """Only the job's Flight Recorder dumps (what a job run without the recorder leaves), optionally edited."""
    dest.mkdir(parents=True)
    for rank in ranks:
        for p in job.fr_dumps(rank):
            data = p.read_bytes()
            (dest / p.name).write_bytes(edit(data) if edit else data)
    return dest


def _no_entries(data: bytes) -> bytes:
    doc = pickle.loads(data)  # our own job's dump
    doc["entries"] = []  # what torch 2.4-2.7 write for gloo
    return pickle.dumps(doc)


@needs_gloo_flight_recorder()
def test_dumps_without_entries_are_incomplete(healthy3, tmp_path):
    code, doc = diagnose(_plain_dumps(healthy3, tmp_path / "empty", range(3), _no_entries))
    assert (code, *verdict(doc)) == (1, "incomplete", [("no_collectives", None, [])]), doc


@needs_gloo_flight_recorder()
def test_dumps_cut_in_half_are_incomplete(healthy3, tmp_path):
    folder = _plain_dumps(healthy3, tmp_path / "cut", range(3))
    for rank in (1, 2):
        for p in folder.glob(f"rank{rank}.fr.*.pkl"):
            p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    code, doc = diagnose(folder)
    assert (code, *verdict(doc)) == (1, "incomplete", [("no_dump", None, [])]), doc
    assert doc["suspect_ranks"] == [1, 2]


def test_two_jobs_are_refused(healthy3, hung_then_interrupted):
    _live, other = hung_then_interrupted
    code, doc = diagnose(healthy3.out, other.out)
    assert code == 2 and "more than one job" in doc["error"], doc


@needs_gloo_flight_recorder()
def test_plain_dumps_of_two_jobs_are_refused(healthy3, hung_then_interrupted, tmp_path):
    _live, other = hung_then_interrupted
    # Plain dumps only: rank 0 of one job, rank 1 of the other.
    mixed = tmp_path / "mixed"
    _plain_dumps(healthy3, mixed / "a", [0])
    _plain_dumps(other, mixed / "b", [1])
    code, doc = diagnose(mixed)
    assert code == 2 and "different runs" in doc["error"], doc


# --- one record per node ------------------------------------------------------------------------------------


def test_one_record_per_node_is_one_job(tmp_path):
    """Two `record`s, one per "node" (folder), each running one rank of a 2-rank job: read together."""
    (tmp_path / "job.py").write_text(JOB)
    port = _free_port()
    procs = []
    for rank in (0, 1):
        env = job_env(MODE="plain", STEPS="6", RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(record_cmd(tmp_path / f"node{rank}", [sys.executable, "job.py"]),
                                      cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE))
    for p in procs:
        _out, err = p.communicate(timeout=90)
        assert p.returncode == 0, err
    code, doc = diagnose(tmp_path / "node0", tmp_path / "node1")
    assert (code, *verdict(doc)) == (0, "ok", []), doc
    assert doc["ranks_with_data"] == [0, 1]
    together = tmp_path / "together"  # both folders copied into one: nothing overwritten
    for rank in (0, 1):
        shutil.copytree(tmp_path / f"node{rank}", together, dirs_exist_ok=True)
    assert len(list(together.glob("job.*.json"))) == 2
    assert verdict(diagnose(together)[1]) == ("ok", [])


# --- issue 21: the shapes of real training jobs, diagnosed afterwards and live -------------------------------
#
# FAULT picks the job's shape and what goes wrong at step AT (its collectives are #AT+1 on each group):
#   mesh      4 ranks, a 2x2 init_device_mesh (tp = [0,1] [2,3], dp = [0,2] [1,3]) and the default group; rank 3
#             skips tp's all_reduce and goes on to dp's and the default group's (a cross-group order deviation)
#   pipeline  3 ranks passing activations 0 -> 1 -> 2; at AT rank 0 sends to 1, rank 1 receives from 2, and rank
#             2 sends nothing and goes on to the all_reduce
#   batch     3 ranks exchanging around a ring with batch_isend_irecv; at AT rank 2 leaves its send out
#   root      3 ranks broadcasting from rank 0; at AT rank 2 broadcasts from itself
#   freeze    rank WHO stops itself (SIGSTOP) before its all_reduce
#   exit      rank 1 calls sys.exit(0) before its all_reduce
#   late      rank 2 sleeps LATE seconds before its all_reduce; the job then completes
# A hung job ends when gloo's wait times out (TIMEOUT seconds), or when the test interrupts `record`.
SHAPES = """
import os, signal, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ["TIMEOUT"])))
rank, world = dist.get_rank(), dist.get_world_size()
fault, at = os.environ["FAULT"], 2
t = torch.ones(4)
if fault == "mesh":
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tp, dp = mesh.get_group("tp"), mesh.get_group("dp")


def step(i):
    if fault == "mesh":
        if not (rank == 3 and i == at):
            dist.all_reduce(t, group=tp)  # @tp
        dist.all_reduce(t, group=dp)
        dist.all_reduce(t)
    elif fault == "pipeline":
        if i == at:
            if rank == 0:
                dist.send(t, 1)  # @send
            elif rank == 1:
                dist.recv(t, 2)  # @recv
        else:
            if rank < world - 1:
                dist.send(t, rank + 1)
            if rank > 0:
                dist.recv(t, rank - 1)
        dist.all_reduce(t)
    elif fault == "batch":
        ops = [dist.P2POp(dist.irecv, torch.empty(4), (rank - 1) % world)]
        if not (rank == 2 and i == at):
            ops.append(dist.P2POp(dist.isend, t, (rank + 1) % world))
        for work in dist.batch_isend_irecv(ops):  # @batch
            work.wait()
        dist.all_reduce(t)
    elif fault == "root":
        dist.broadcast(t, src=2 if (rank == 2 and i == at) else 0)  # @bcast
    else:
        if i == at and fault == "freeze" and rank == int(os.environ["WHO"]):
            os.kill(os.getpid(), signal.SIGSTOP)
        if i == at and fault == "exit" and rank == 1:
            sys.exit(0)  # @exit
        if i == at and fault == "late" and rank == 2:
            time.sleep(float(os.environ["LATE"]))  # @late
        dist.all_reduce(t)


for i in range(5):
    step(i)
    time.sleep(0.05)
if fault == "late":
    time.sleep(2)  # the watchdogs see the stall resolved
dist.barrier()
dist.destroy_process_group()
"""

# name: (FAULT, ranks, extra environment). TIMEOUT leaves the live verdict time to be gathered (a rank that does
# not answer costs the gatherer 5 s, and another rank 2 s more when that rank is rank 0).
SHAPE_JOBS = {
    "mesh": ("mesh", 4, {"TIMEOUT": "8"}),
    "pipeline": ("pipeline", 3, {"TIMEOUT": "8"}),
    "batch": ("batch", 3, {"TIMEOUT": "8"}),
    "root": ("root", 3, {"TIMEOUT": "8"}),
    "frozen-rank1-ctrl-c": ("freeze", 3, {"WHO": "1", "TIMEOUT": "120"}),
    "frozen-rank0": ("freeze", 3, {"WHO": "0", "TIMEOUT": "14"}),
    "early-exit": ("exit", 3, {"TIMEOUT": "8"}),
    "late": ("late", 3, {"TIMEOUT": "30", "LATE": "4"}),
}
CONCURRENT = 4  # jobs run at once: most of a job's time is waiting (the stall, gloo's timeout), not CPU
SHAPE_ORDER = ["late", "frozen-rank1-ctrl-c", "frozen-rank0", "mesh", "pipeline", "batch", "root", "early-exit"]


def _start_shape(runner, name: str) -> RunningJob:
    fault, nproc, env = SHAPE_JOBS[name]
    cwd = runner.folder()
    runner.write(cwd, SHAPES)
    # on a signal, torchrun SIGKILLs what its SIGTERM did not end (a stopped rank) after 2 s instead of 30 (after a
    # rank failed, torch 2.13 waits its own 30 s)
    return runner.start_in(cwd, torchrun(nproc), record_args=("--stall-after", "2"),
                           env=dict(FAULT=fault, TORCH_ELASTIC_SHUTDOWN_TIMEOUT="2", **env))


def _finish_shape(name: str, running: RunningJob) -> JobResult:
    if name.endswith("ctrl-c"):  # the user presses Ctrl-C once the live verdict named the frozen rank
        running.wait_until((running.out / "stall-verdict.json").exists, "the live verdict")
        time.sleep(1.0)
        return interrupt(running, signal.SIGINT)
    if name == "frozen-rank0":
        _kill_the_stopped_rank_once_the_others_ended(running, stopped=0, world=SHAPE_JOBS[name][1])
    return running.finish(120)


def _kill_the_stopped_rank_once_the_others_ended(running: RunningJob, stopped: int, world: int) -> None:
    """SIGKILL the stopped rank as soon as the others ended (gloo's timeout), as torchrun does: torch 2.13's
    torchrun sends SIGTERM, which a stopped process keeps pending, and SIGKILL 30 s later whatever
    TORCH_ELASTIC_SHUTDOWN_TIMEOUT says (the failure path closes its workers with its own default)."""
    pids = {}

    def others_ended() -> bool:
        for rank in range(world):
            if rank not in pids:
                header = read_header(running.out / f"rank{rank}.events.jsonl")
                if header is None:
                    return False
                pids[rank] = header["pid"]
        return all(process_state(pids[r]) == "gone" for r in pids if r != stopped)

    running.wait_until(others_ended, "the other ranks' end", timeout=120)
    try:
        os.kill(pids[stopped], signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def shape_jobs(module_jobs) -> dict[str, JobResult]:
    """Every shape, CONCURRENT jobs at a time, the longest first: a job starts as soon as one ends."""
    lock = threading.Lock()  # the runner numbers its folders

    def run(name: str) -> JobResult:
        with lock:
            running = _start_shape(module_jobs, name)
        return _finish_shape(name, running)

    with ThreadPoolExecutor(CONCURRENT) as pool:
        futures = {name: pool.submit(run, name) for name in sorted(SHAPE_JOBS, key=SHAPE_ORDER.index)}
        return {name: future.result() for name, future in futures.items()}


def shape(doc: dict) -> tuple:
    """(status, roots [(kind, group, seq, culprits, suspects)], the others {(kind, group, seq)}): each other
    finding is blocked by the first root and has no culprit."""
    roots = [f for f in doc["findings"] if f.get("blocked_by") is None]
    rest = [f for f in doc["findings"] if f.get("blocked_by") is not None]
    assert all(f["blocked_by"] == 1 and not f["culprit_ranks"] for f in rest), doc
    return (doc["status"], [(f["kind"], f["process_group"], f["seq"], f["culprit_ranks"], f["suspect_ranks"])
                            for f in roots], {(f["kind"], f["process_group"], f["seq"]) for f in rest})


def live(job: JobResult) -> tuple[str, tuple]:
    """The event of record's stall-verdict.json and the shape of its verdict."""
    doc = json.loads((job.out / "stall-verdict.json").read_text())
    return doc["event"], shape(doc["verdict"])


D = "default_pg"
SHAPE_EXPECTED = {
    # name: (diagnose's exit status and shape, the live verdict file's event and shape)
    "mesh": ((1, ("desync", [("order_mismatch", "mesh_tp", 3, [3], [])],
                  {("missing_ranks", "mesh_tp", 3), ("missing_ranks", "mesh_dp", 3), ("missing_ranks", D, 3)})),
             ("stall", ("desync", [("order_mismatch", "mesh_tp", 3, [3], [])],
                        {("missing_ranks", "mesh_tp", 3), ("missing_ranks", "mesh_dp", 3),
                         ("missing_ranks", D, 3)}))),
    "pipeline": ((1, ("desync", [("p2p_mismatch", D, None, [2], [])],
                      {("p2p_mismatch", D, None), ("missing_ranks", D, 3)})),
                 ("stall", ("desync", [("p2p_mismatch", D, None, [2], [])],
                            {("p2p_mismatch", D, None), ("missing_ranks", D, 3)}))),
    "batch": ((1, ("desync", [("p2p_mismatch", D, None, [2], [])], {("missing_ranks", D, 3)})),
              ("stall", ("desync", [("p2p_mismatch", D, None, [2], [])], {("missing_ranks", D, 3)}))),
    # gloo: rank 1 got rank 0's broadcast and went on to #4, where it waits (live only: diagnose tells a
    # group's first unfinished collective)
    # diagnose reads rank 2's history (its root at this line broke its cycle); the live verdict's positions have
    # none: both roots are suspects there.
    "root": ((1, ("desync", [("root_mismatch", D, 3, [2], [])], set())),
             ("stall", ("desync", [("root_mismatch", D, 3, [], [0, 2])], {("missing_ranks", D, 4)}))),
    "frozen-rank1-ctrl-c": ((1, ("stuck", [("rank_frozen", D, 3, [1], [])], set())),
                            ("stall", ("stuck", [("rank_frozen", D, 3, [1], [])], set()))),
    "frozen-rank0": ((1, ("stuck", [("rank_frozen", D, 3, [0], [])], set())),
                     ("stall", ("stuck", [("rank_frozen", D, 3, [0], [])], set()))),
    "early-exit": ((1, ("stuck", [("missing_ranks", D, 3, [1], [])], set())), None),  # peers fail at once
    "late": ((0, ("ok", [("missing_ranks", D, 3, [2], [])], set())),
             ("resolved", ("stuck", [("missing_ranks", D, 3, [2], [])], set()))),
}


def _mesh_names(job: JobResult) -> dict[str, str]:
    """What diagnose calls the mesh job's groups: ``mesh_tp`` and ``mesh_dp`` where DeviceMesh describes its
    groups (torch 2.8 on, as run here); torch 2.4 leaves them ``undefined``, so they go by their numbers (rank
    2's tp group [2, 3] and dp group [0, 2], the groups its stall is in)."""
    groups = {tuple(g.ranks): g for g in read_event_log(job.out / "rank2.events.jsonl").groups.values()}
    return {desc: g.desc if g.desc != "undefined" else g.name
            for desc, g in (("mesh_tp", groups[(2, 3)]), ("mesh_dp", groups[(0, 2)]))}


def _renamed(expected: tuple, names: dict[str, str]) -> tuple:
    """An expected (status, roots, others) shape with its group names replaced by ``names``."""
    status, roots, rest = expected
    return (status, [(kind, names.get(g, g), *more) for kind, g, *more in roots],
            {(kind, names.get(g, g), seq) for kind, g, seq in rest})


@pytest.mark.parametrize("name", list(SHAPE_JOBS))
def test_job_shapes_diagnosed_afterwards_and_live(shape_jobs, name):
    job = shape_jobs[name]
    (code, expected), expected_live = SHAPE_EXPECTED[name]
    if name == "mesh":
        names = _mesh_names(job)
        expected, expected_live = _renamed(expected, names), (expected_live[0], _renamed(expected_live[1], names))
    got_code, doc = diagnose(job.out)
    assert (got_code, shape(doc)) == (code, expected), (doc, job.explain())
    if expected_live is None:
        assert not (job.out / "stall-verdict.json").exists()
        return
    assert live(job) == expected_live, job.explain()
    # One verdict per stall, however many ranks detected it: printed once, with every rank that could answer.
    assert job.stderr.count("live verdict at stall") == 1, job.stderr
    verdict = json.loads((job.out / "stall-verdict.json").read_text())["verdict"]
    frozen = {r for f in verdict["findings"] if f["kind"] == "rank_frozen" for r in f["culprit_ranks"]}
    assert set(verdict["ranks_with_data"]) | frozen == set(range(SHAPE_JOBS[name][1]))


def test_a_frozen_rank_is_no_crash_even_when_its_launcher_killed_it_later(shape_jobs):
    job = shape_jobs["frozen-rank1-ctrl-c"]
    assert job.job_file()["signal"] == "SIGINT"
    (probe,) = {p["rank"]: p for p in job.job_file()["probes"]}.values()
    assert (probe["rank"], probe["state"]) == (1, "stopped")
    _code, doc = diagnose(job.out)
    (f,) = doc["findings"]
    assert "its process was alive at the stall" in f["detail"] and "stopped (SIGSTOP" in f["detail"]
    assert no_process_left(job)


def test_a_late_rank_passes_unless_ci_asks_to_fail_on_it(shape_jobs):
    job = shape_jobs["late"]
    assert job.returncode == 0, job.explain()
    _code, doc = diagnose(job.out)
    (f,) = doc["findings"]
    assert f["resolved"] and "Rank 2 issued all_reduce #3 4." in f["detail"] and "the job went on" in f["detail"]
    assert f["stacks"]["2"][0].startswith("job.py:") and f["stacks"]["2"][0].endswith(" step")
    proc = run_cli_process("diagnose", str(job.out), "--fail-on", "late", timeout=120)
    assert proc.code == 1 and proc.out.startswith("OK:"), proc.out
