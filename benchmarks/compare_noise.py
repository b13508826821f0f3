"""How often ``compare --fail-on 'exposed_comm>5%'`` cries wolf on identical runs, and whether it catches real
changes, on this machine: the rule of ``compare`` today against the rule before it, on the same recordings.

Each pair is two recordings of a 2-rank DDP job on gloo, one after the other, as a CI job meets its baseline
(run to run, the machine's load differs: that is the noise), or with ``--together`` started together (each
waits for a file that appears once both are ready: the same load, but 4 ranks on 2 cores). The job is the
example's
(``examples/ddp_train.py``: a 784-128-64-10 MLP, Adam, DDP's gradient all-reduce in backward, a reduce and a
barrier at the end), written out here so that a variant can plant a change:

- ``same``: the job again (noise only: every failure is a false alarm);
- ``slow``: DDP's gradient all-reduce made slower (a comm hook that queues an all-reduce of ``--slow-pad`` of
  the bucket's size in zeros before the bucket's own: about 20 % more time in communication, no compute);
- ``late``: rank 1 sleeps ``--late-ms`` before each backward (rank 0 waits for it in DDP's all-reduce).

Every step compared is profiled (``--profile-steps``): gloo's Flight Recorder does not time DDP's collectives,
the profiler does. Each pair is compared both ways, with the gate, by ``compare.document.build`` with
``beyond_load`` on (today's rule: communication judged beyond the largest shift of any rank's compute, and a
gate that fires only on a line beyond the margin too) and off, with a gate that reads the interval alone
(the rule before):

    python benchmarks/compare_noise.py                       # 20 same pairs, 5 slow, 5 late (~15 min)
    python benchmarks/compare_noise.py --pairs 4 --planted 2  # a smoke run

Target: 0 of 20 identical pairs fail, every planted pair is caught. Figures only; nothing here asserts.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from comm2perfetto.compare.document import CompareOptions, build
from comm2perfetto.compare.gate import gate_failures, parse_gate
from comm2perfetto.compare.sides import load_side
from comm2perfetto.compare.verdicts import Verdict
from comm2perfetto.load_options import COMPARE

GATE = "exposed_comm>5%"
STEPS = 24  # per run (--steps), of which 3..STEPS-2 are profiled and compared (the first rebuilds DDP's buckets)
READY_TIMEOUT_S = 300.0
# The example's MLP made wider (7 MiB of gradients) and fed small batches: the all-reduce is most of a step,
# so that 20 % more time in it is more than the gate's 5 % of the step.
WIDTH, BATCH = 1024, 16

JOB = """
import argparse
import gc
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--go")
parser.add_argument("--steps", type=int)
parser.add_argument("--slow-pad", type=float, default=0.0)
parser.add_argument("--late-ms", type=float, default=0.0)
parser.add_argument("--width", type=int)
parser.add_argument("--batch", type=int)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(784, args.width), nn.ReLU(), nn.Linear(args.width, args.width),
                          nn.ReLU(), nn.Linear(args.width, 10)))
if args.slow_pad:
    extra = {}

    def slower_all_reduce(state, bucket):
        # DDP's own hook (divide, all-reduce), behind an all-reduce of slow_pad of the bucket's size in zeros
        # that the group's queue runs first: as much more communication, no more compute
        grads = bucket.buffer().div_(dist.get_world_size())
        pad = extra.setdefault(grads.numel(), torch.zeros(int(grads.numel() * args.slow_pad)))
        dist.all_reduce(pad, async_op=True)
        return dist.all_reduce(grads, async_op=True).get_future().then(lambda f: f.value()[0])
    model.register_comm_hook(None, slower_all_reduce)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
gen = torch.Generator().manual_seed(0)
data = [(torch.randn(args.batch, 1, 28, 28, generator=gen), torch.randint(0, 10, (args.batch,), generator=gen))
        for _ in range(args.steps)]
if rank == 0:
    open("ready", "w").close()
while not os.path.exists(args.go):  # both runs of the pair start training together
    time.sleep(0.01)
for x, y in data:
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    if rank == 1 and args.late_ms:
        time.sleep(args.late_ms / 1000)
    loss.backward()
    optimizer.step()
dist.reduce(loss.detach(), dst=0)
dist.barrier()
dist.destroy_process_group()
del model, optimizer
gc.collect()
"""


def compared(steps: int) -> tuple[int, int]:
    """The steps compared of a run of ``steps``: from the fourth to the one before the last."""
    return 3, steps - 2


def record_pair(folder: Path, variant: list[str], together: bool = False, steps: int = STEPS) -> tuple[Path, Path]:
    """Record BASE (the job) and NEW (the job with ``variant``'s arguments): one after the other, as a CI job
    meets its baseline, or ``together`` (both start training at once, on the same cores)."""
    runs = [(folder / "base", []), (folder / "new", variant)]
    for batch in ([runs] if together else [[run] for run in runs]):
        go = folder / f"go-{len(list(folder.glob('go-*')))}"
        procs = [(cwd, _start(cwd, go, extra, steps)) for cwd, extra in batch]
        try:
            deadline = time.monotonic() + READY_TIMEOUT_S
            while not all((cwd / "ready").exists() for cwd, _ in procs):
                if time.monotonic() > deadline or any(p.poll() is not None for _, p in procs):
                    raise RuntimeError(f"a job of {folder} ended or hung before training")
                time.sleep(0.05)
            go.touch()
            for cwd, proc in procs:
                _, err = proc.communicate(timeout=READY_TIMEOUT_S)
                if proc.returncode != 0:
                    raise RuntimeError(f"{cwd}: exit status {proc.returncode}: {err.decode()[-800:]}")
        finally:  # interrupted: record forwards the signal to its job
            for _, proc in procs:
                if proc.poll() is None:
                    proc.terminate()
                    proc.wait(timeout=60)
    return folder / "base" / "out", folder / "new" / "out"


def _start(cwd: Path, go: Path, extra: list[str], steps: int) -> subprocess.Popen:
    """``comm2perfetto record`` of the job in ``cwd``; its training waits for ``go``."""
    cwd.mkdir()
    (cwd / "job.py").write_text(JOB)
    cmd = [sys.executable, "-m", "comm2perfetto", "record", "-o", str(cwd / "out"), "--stall-after", "off",
           "--profile-steps", "{}-{}".format(*compared(steps)), "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "job.py", "--go", str(go), "--steps", str(steps), "--width", str(WIDTH), "--batch", str(BATCH), *extra]
    return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def judge(base: Path, new: Path, steps: int = STEPS) -> dict[str, dict]:
    """The comparison under each rule: whether the gate fired, the cause, and the job's changes. The rule
    before read the interval alone (a line within the margin could fire) and judged communication as it was."""
    gate = tuple(parse_gate(GATE))
    sides = [load_side(role, str(path), compared(steps), COMPARE) for role, path in (("BASE", base), ("NEW", new))]
    out = {}
    for rule, beyond_load in (("today", True), ("before", False)):
        doc = build(*sides, CompareOptions(gate=gate, beyond_load=beyond_load))
        if rule == "before":
            as_changed = [{**line, "verdict": Verdict.REGRESSED} if line["verdict"] == Verdict.UNCHANGED else line
                          for line in doc["lines"]]
            doc["gate"]["failed"] = gate_failures(gate, as_changed)
        job = {line["metric"]: line for line in doc["lines"] if line["section"] == "job"}
        changes = {m: job[m]["relative"] for m in ("step_time", "compute", "comm", "exposed_comm")
                   if m in job and job[m]["relative"] is not None}
        reduces = [line for line in doc["lines"] if line["section"] == "collective"
                   and line.get("op") == "all_reduce" and line["metric"] == "duration" and line["relative"] is not None]
        if reduces:  # the gradients' all-reduce: the longest one
            changes["all_reduce"] = max(reduces, key=lambda line: line["base"] or 0.0)["relative"]
        tripped = [doc["lines"][i] for failure in doc["gate"]["failed"] for i in failure["lines"]]
        out[rule] = {"fired": bool(tripped), "cause": doc.get("cause"), "changes": changes,
                     "tripped": [f"{line['section']} {line.get('rank', '')} {line['metric']} "
                                 f"{100 * line['relative_low']:+.1f}%..{100 * line['relative_high']:+.1f}%"
                                 + (f" (beyond compute x{line['context']['load_factor']:.2f})"
                                    if line["context"].get("load_factor") else "") for line in tripped]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=20, help="pairs of identical runs")
    parser.add_argument("--planted", type=int, default=5, help="pairs of each planted change")
    parser.add_argument("--steps", type=int, default=STEPS, help="steps a run (from the fourth to the one before "
                        "the last compared, each profiled)")
    parser.add_argument("--slow-pad", type=float, default=0.25, help="the slow all-reduce's padding")
    parser.add_argument("--late-ms", type=float, default=30.0, help="rank 1's delay before each backward")
    parser.add_argument("--together", action="store_true",
                        help="start a pair's two runs together (4 ranks on this machine's 2 cores: a late rank's "
                             "sleep then costs nothing, the others take its core)")
    args = parser.parse_args()
    kinds = (["same"] * args.pairs + ["slow"] * args.planted + ["late"] * args.planted)
    variants = {"same": [], "slow": ["--slow-pad", str(args.slow_pad)], "late": ["--late-ms", str(args.late_ms)]}
    fired: dict[tuple[str, str], int] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="compare_noise-") as tmp:
        for i, kind in enumerate(kinds):
            folder = Path(tmp) / f"pair{i}"
            folder.mkdir()
            result = judge(*record_pair(folder, variants[kind], args.together, args.steps), args.steps)
            for rule, r in result.items():
                fired[(kind, rule)] = fired.get((kind, rule), 0) + r["fired"]
            today, before = result["today"], result["before"]
            changes = ", ".join(f"{m} {100 * v:+.1f}%" for m, v in today["changes"].items())
            cause = f" -- {today['cause']}" if today["cause"] else ""
            print(f"pair {i:2d} {kind:4s}  today: {'FAIL' if today['fired'] else 'pass'}  before: "
                  f"{'FAIL' if before['fired'] else 'pass'}  ({changes}){cause}", flush=True)
            for tripped in today["tripped"]:
                print(f"         tripped: {tripped}", flush=True)
    runs = "together" if args.together else "in turn"
    print(f"\n{GATE}, {len(kinds)} pairs in {time.monotonic() - started:.0f} s "
          "(steps {}-{} of {}, profiled; runs {})".format(*compared(args.steps), args.steps, runs))
    for kind, total, want in (("same", args.pairs, "false alarms"), ("slow", args.planted, "caught"),
                              ("late", args.planted, "caught")):
        if total:
            print(f"  {kind:4s} pairs: {want}: today {fired.get((kind, 'today'), 0)}/{total}, "
                  f"before {fired.get((kind, 'before'), 0)}/{total}")


if __name__ == "__main__":
    main()
