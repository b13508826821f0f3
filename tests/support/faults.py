"""Generated fault jobs (issue 32's fault matrix): a spec, the gloo job it makes, what is true of it, running it
under the real ``comm2perfetto record`` CLI, and scoring diagnose's and the live verdict's answers against the
truth. ``benchmarks/fault_sweep.py`` and ``tests/integration/test_fault_sweep.py`` are built on it.

A spec is one line, the form ``--spec`` takes::

    reorder@mesh,w=4,k=2,r=0+3,seed=17

fault ``reorder`` on the ``mesh`` topology, world size 4, at step 2, on ranks 0 and 3, and a seed that picks the
details the truth does not depend on (the tensor's size, which other collective ``op`` issues, whether a hang is
ended by Ctrl-C to ``record`` or by gloo's own timeout). ``job_script(spec)`` writes a script that reads as the
job a person would write: a ``normal_step`` every rank runs, and the ``faulty_step`` the faulty ranks run at
step ``K`` instead.

Topologies (each step's collectives):

- ``default``: one all_reduce on the default group;
- ``pairs``: a group per pair (0,1), (2,3)...: an all_reduce on the pair's group, then one on the default group;
- ``mesh``: 4 ranks as 2x2 (tp {0,1} {2,3}, dp {0,2} {1,3}; new_group or init_device_mesh by the seed): an
  all_reduce on tp, then on dp;
- ``pipeline``: rank i receives from i-1 and sends to i+1, then an all_reduce on the default group;
- ``ddp``: a DistributedDataParallel step of a small Linear (its gradient all_reduce comes from C++, seen only by
  Flight Recorder), then an all_reduce of the step's metrics.

Faults, on the faulty ranks at step K (``FAULTS`` says what each does, ``truth`` what follows from it).
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.jobs import job_env, kill_tree, record_cmd, torchrun

TOPOLOGIES = ("default", "pairs", "mesh", "pipeline", "ddp")

FAULTS = {
    "none": "nothing: a healthy job",
    "skip": "skips its step's first collective (pipeline: its send; ddp: the whole training step)",
    "extra": "issues an extra all_reduce before its step's first collective",
    "reorder": "issues its step's two collectives (two groups: pairs, mesh) in the other order",
    "size": "passes a tensor of another size to its step's first collective (pipeline: its send; ddp: the metrics)",
    "splits": "passes all_to_all_single split sizes that disagree with its peers' (the totals agree)",
    "dtype": "passes a float64 tensor to its step's first collective (pipeline: its send; ddp: the metrics)",
    "op": "issues another collective (broadcast or all_gather) where the others all_reduce",
    "group_order": "creates two new groups X and Y in the other order (its c10d group ids differ)",
    "objects": "passes broadcast_object_list a shorter list than its peers'",
    "sigstop": "stops itself (SIGSTOP)",
    "gil": "holds the GIL in C (a runaway regex)",
    "deadlock": "blocks on a threading.Lock it already holds",
    "kill": "SIGKILLs itself",
    "abort": "calls os.abort()",
    "exception": "raises an exception",
    "sleep": "sleeps past gloo's timeout",
}

# What a fault line of a job script says.
_NOTES = {"skip": "skipped", "extra": "an extra all_reduce", "reorder": "the other order", "size": "another size",
          "splits": "other split sizes, the same total", "dtype": "float64", "op": "another collective",
          "objects": "a shorter list", "sigstop": "stops itself", "gil": "holds the GIL (a runaway regex)",
          "deadlock": "waits for a lock it holds", "kill": "SIGKILL", "abort": "abort", "exception": "raises",
          "sleep": "sleeps past gloo's timeout"}
# Faults that need something of the topology, and the topologies they are generated on.
_TOPOLOGIES_OF = {
    "reorder": ("pairs", "mesh"),
    "splits": ("default",),
    "objects": ("default", "ddp"),
}
# Faults that may be on two ranks at once (two ranks whose fault still leaves them disagreeing with the others).
_TWO_RANKS = {"skip", "extra", "size", "dtype", "sigstop", "deadlock", "kill", "exception", "sleep", "reorder"}
_FAULT_LINE = "# FAULT"  # marks the fault's lines in a job script

PAUSE_S = 0.05  # between steps
INTERRUPT_TIMEOUT_S = 120  # gloo's timeout where the harness ends a hang with Ctrl-C (it never fires first)
GLOO_TIMEOUT_S = 15  # where gloo's timeout ends a hang: after the live verdict (stall 2 s + gathering <= 9 s)
STALL_AFTER_S = 2


class SpecError(ValueError):
    """A spec string that does not parse, or a combination the generator does not make."""


@dataclass(frozen=True)
class Spec:
    fault: str
    topology: str
    world: int
    k: int
    ranks: tuple[int, ...]
    seed: int

    def __str__(self) -> str:
        if self.fault == "none":
            return f"none@{self.topology},w={self.world},seed={self.seed}"
        return (f"{self.fault}@{self.topology},w={self.world},k={self.k},r={'+'.join(map(str, self.ranks))},"
                f"seed={self.seed}")

    @classmethod
    def parse(cls, text: str) -> Spec:
        """``skip@pairs,w=4,k=1,r=2,seed=5`` (a healthy job: ``none@pairs,w=4,seed=5``) -> Spec; raises
        SpecError on anything else."""
        try:
            head, *fields = text.strip().split(",")
            fault, topology = head.split("@")
            values = dict(f.split("=", 1) for f in fields)
            healthy = fault == "none" and not {"k", "r"} & set(values)
            spec = cls(fault, topology, int(values.pop("w")), 0 if healthy else int(values.pop("k")),
                       () if healthy else tuple(int(r) for r in values.pop("r").split("+")),
                       int(values.pop("seed")))
        except KeyError as exc:
            raise SpecError(f"{text!r}: no {exc.args[0]}= (a spec reads 'skip@pairs,w=4,k=1,r=2,seed=5')") from None
        except ValueError:
            raise SpecError(f"{text!r}: not a spec like 'skip@pairs,w=4,k=1,r=2,seed=5'") from None
        if values:
            raise SpecError(f"{text!r}: unknown fields {sorted(values)}")
        spec.check()
        return spec

    def check(self) -> None:
        """Raise SpecError unless this is a combination the generator makes (a job whose truth is known)."""
        problems = self._problems()
        if problems:
            raise SpecError(f"{self}: " + "; ".join(problems))

    def _problems(self) -> list[str]:
        if self.fault not in FAULTS:
            return [f"unknown fault {self.fault!r} (one of {', '.join(FAULTS)})"]
        if self.topology not in TOPOLOGIES:
            return [f"unknown topology {self.topology!r} (one of {', '.join(TOPOLOGIES)})"]
        out = []
        if not 2 <= self.world <= 8:
            out.append("world size 2 to 8")
        if self.topology == "pairs" and self.world % 2:
            out.append("pairs needs an even world size")
        if self.topology == "mesh" and self.world != 4:
            out.append("mesh is 2x2: world size 4")
        if self.fault == "none":
            return out + ["a healthy job has no step and no faulty ranks"] * bool(self.k or self.ranks)
        if self.topology not in _TOPOLOGIES_OF.get(self.fault, TOPOLOGIES):
            out.append(f"{self.fault} is made on {', '.join(_TOPOLOGIES_OF[self.fault])} only")
        if not 0 <= self.k <= 5:
            out.append("k from 0 to 5")
        if len(set(self.ranks)) != len(self.ranks) or not 1 <= len(self.ranks) <= 2 or \
                not all(0 <= r < self.world for r in self.ranks) or list(self.ranks) != sorted(self.ranks):
            return out + ["one or two distinct faulty ranks, ascending, below the world size"]
        if len(self.ranks) == 2:
            out += self._two_rank_problems()
        elif self.fault == "reorder" and self.topology == "mesh":
            # One rank issuing dp before tp: its dp peer does tp (with its own tp peer) then dp with it, and
            # nobody waits for long. It takes two, on the mesh's diagonal, to wait on each other.
            out.append("reorder on the mesh takes two ranks, 0+3 or 1+2")
        if self.fault in ("skip", "size", "dtype") and self.topology == "pipeline" and \
                max(self.ranks) == self.world - 1:
            out.append(f"{self.fault} on a pipeline is on a send: the last rank sends nothing")
        return out

    def _two_rank_problems(self) -> list[str]:
        a, b = self.ranks
        if self.fault not in _TWO_RANKS or self.topology == "pipeline":
            return [f"{self.fault} on {self.topology} is made on one rank"]
        if self.fault == "reorder":
            # Two ranks of the mesh that reorder deadlock only when they are diagonal (each waits for the other's
            # tp peer); a pair's both ranks reordering agree with each other.
            return [] if self.topology == "mesh" and {a, b} in ({0, 3}, {1, 2}) else \
                ["reorder on two ranks: the mesh's diagonal, 0+3 or 1+2"]
        if self.topology == "mesh":
            return ["two faulty ranks on the mesh: reorder only"]
        if self.world < 3:
            return ["two faulty ranks need a third rank that is not"]
        if self.topology == "pairs" and a // 2 == b // 2:
            return ["two faulty ranks of one pair agree with each other: take ranks of two pairs"]
        return []

    # The details the seed picks: none of them changes the truth.
    def _rng(self) -> random.Random:
        return random.Random(f"{self}")

    @property
    def numel(self) -> int:
        return self._rng().randrange(8, 33)

    @property
    def other_numel(self) -> int:
        """The faulty size (fault ``size``): a few elements more or fewer."""
        rng = self._rng()
        rng.random()
        return self.numel + rng.choice((-3, 3))

    @property
    def other_op(self) -> str:
        rng = self._rng()
        rng.random(), rng.random()
        return rng.choice(("broadcast", "all_gather"))

    @property
    def ending(self) -> str:
        """How a hang ends: ``interrupt`` (Ctrl-C to record once the live verdict is out) or ``timeout``
        (gloo's, raising in the ranks that wait)."""
        if self.fault == "sleep":
            return "timeout"
        # init_device_mesh gives its groups gloo's default timeout (30 min): no timeout ends those
        return "timeout" if self.seed % 4 == 0 and not self.uses_device_mesh else "interrupt"

    @property
    def uses_device_mesh(self) -> bool:
        """The mesh made by init_device_mesh (else by new_group)."""
        return self.topology == "mesh" and self.seed % 2 == 1 and self.fault != "sleep"

    @property
    def gloo_timeout_s(self) -> int:
        return GLOO_TIMEOUT_S if self.ending == "timeout" else INTERRUPT_TIMEOUT_S


# --- the truth of a spec ------------------------------------------------------------------------------------

HEALTHY_STATUSES = frozenset({"ok", "running", "interrupted"})


@dataclass(frozen=True)
class Truth:
    """What follows from a spec: the ranks at fault, the statuses each judge may give, the ranks never to blame,
    and whether the job stalls (True: it hangs, a live verdict is due; False: it ends at once, as when a rank dies
    and its peers fail; None: either, as a size mismatch gloo may abort at once or leave hanging)."""

    culprits: frozenset[int]
    innocent: frozenset[int]
    diagnose: frozenset[str]
    live: frozenset[str]
    stalls: bool | None

    def to_json(self) -> dict[str, Any]:
        return {"culprits": sorted(self.culprits), "innocent": sorted(self.innocent),
                "diagnose": sorted(self.diagnose), "live": sorted(self.live), "stalls": self.stalls}


def truth(spec: Spec) -> Truth:
    """The truth of ``spec``, reasoned from what gloo does (docs in FAULTS and below)."""
    everyone = frozenset(range(spec.world))
    if spec.fault == "none":
        return Truth(frozenset(), everyone, frozenset({"ok"}), frozenset(), False)
    culprits = frozenset(spec.ranks)
    timed_out = {"crashed"} if spec.ending == "timeout" else set()  # the waiting ranks raise gloo's timeout
    if spec.fault in ("kill", "abort", "exception"):
        # Its peers fail at once (gloo: "Connection closed by peer"), then torchrun stops the rest: victims.
        # A live verdict is not due; one that comes must still name the dead rank.
        diagnose, live, stalls = {"crashed"}, {"crashed", "stuck"}, False
    elif spec.fault in ("sigstop", "gil", "deadlock", "sleep"):
        # The others wait in their next collective (or receive) until interrupted or timed out.
        diagnose, live, stalls = {"stuck"} | timed_out, {"stuck"}, True
    elif spec.fault in ("skip", "extra", "reorder", "group_order"):
        # Across groups (pairs, mesh, pipeline, new groups) the ranks end up waiting on each other: at once, or
        # (a skip or an extra tp all_reduce in the mesh) at the end, where the shifted group meets the barrier.
        # Within one group in a uniform loop (default, ddp) the sequence shifts and gloo pairs the next
        # collectives unlike: at the end (the barrier against the last all_reduce), or at once where sizes
        # differ (ddp's gradient bucket against the metrics), and gloo may abort a receiving rank (a victim).
        uniform = spec.fault in ("skip", "extra") and spec.topology in ("default", "ddp")
        stalls = None if uniform else True
        diagnose = {"stuck", "desync"} | timed_out | ({"crashed"} if uniform else set())
        live = {"stuck", "desync"}
    else:  # size, splits, dtype, op, objects: gloo aborts a receiving rank (a victim), or the ranks hang
        diagnose, live, stalls = {"desync", "crashed", "stuck"}, {"desync", "stuck", "crashed"}, None
    return Truth(culprits, everyone - culprits, frozenset(diagnose), frozenset(live), stalls)


# --- the generator ------------------------------------------------------------------------------------------

# World sizes, drawn alike: mostly 2 to 4 ranks (a job takes seconds), sometimes 6 or 8.
_WORLDS = {"default": (2, 2, 2, 3, 3, 3, 4, 4, 4, 6, 8), "pairs": (2, 2, 4, 4, 4, 6), "mesh": (4,),
           "pipeline": (2, 3, 3, 4), "ddp": (2, 2, 3)}


def generate(n: int, seed: int) -> list[Spec]:
    """``n`` valid specs, the same for the same seed: faults in turn (shuffled), each on a topology it fits."""
    rng = random.Random(seed)
    specs: list[Spec] = []
    faults = list(FAULTS)
    while len(specs) < n:
        rng.shuffle(faults)
        for fault in faults[: n - len(specs)]:
            specs.append(_one(rng, fault))
    return specs


def _one(rng: random.Random, fault: str) -> Spec:
    while True:
        topology = rng.choice(_TOPOLOGIES_OF.get(fault, TOPOLOGIES))
        world = rng.choice(_WORLDS[topology])
        k = rng.randrange(0, 3) if fault == "gil" else rng.randrange(1, 4)
        if fault == "none":
            ranks, k = (), 0
        elif fault == "reorder" and topology == "mesh":
            ranks = tuple(rng.choice(((0, 3), (1, 2))))
        elif fault in _TWO_RANKS and world >= 3 and rng.random() < 0.25:
            ranks = tuple(sorted(rng.sample(range(world), 2)))
        else:
            ranks = (rng.randrange(world),)
        spec = Spec(fault, topology, world, k, ranks, rng.randrange(1000))
        if not spec._problems():
            return spec


# --- the job script -----------------------------------------------------------------------------------------


def _first_group(topology: str) -> str:
    """The group argument of a topology's first collective in a step."""
    return {"pairs": ", group=pair", "mesh": ", group=tp"}.get(topology, "")


def _normal_ops(spec: Spec) -> list[str]:
    """The lines of one step, every rank alike."""
    extra = {"splits": ["dist.all_to_all_single(got, sent, output_split_sizes=splits, input_split_sizes=splits)"],
             "objects": ["meta = [\"step\", i, \"lr\", 0.1]", "dist.broadcast_object_list(meta, src=0)"]}
    return extra.get(spec.fault, []) + {
        "default": ["dist.all_reduce(t)"],
        "pairs": ["dist.all_reduce(t, group=pair)", "dist.all_reduce(t)"],
        "mesh": ["dist.all_reduce(t, group=tp)", "dist.all_reduce(t, group=dp)"],
        "pipeline": ["if rank > 0:", "    dist.recv(got, rank - 1)", "if rank < world - 1:",
                     "    dist.send(t, rank + 1)", "dist.all_reduce(t)"],
        "ddp": ["train_step()  # DDP's gradient all_reduce, issued from C++", "dist.all_reduce(t)  # the metrics"],
    }[spec.topology]


# Where the fault strikes: the faulty ranks run these lines before their step (the step then runs as usual).
_BEFORE = {
    "sigstop": "os.kill(os.getpid(), signal.SIGSTOP)",
    "gil": "re.match(r\"(a+)+$\", \"a\" * 32 + \"b\")",
    "deadlock": "with lock:\n    lock.acquire()",
    "kill": "os.kill(os.getpid(), signal.SIGKILL)",
    "abort": "os.abort()",
    "exception": "raise RuntimeError(f\"injected fault on rank {rank} at step {i}\")",
    "sleep": "time.sleep(TIMEOUT_S + 30)",
}


def _target(spec: Spec) -> int:
    """The index of the step's line the fault changes: the first collective, but a pipeline's send (skip, size,
    dtype) or all_reduce (op), and ddp's training step (skip) or metrics (size, dtype, op)."""
    if spec.fault in ("splits", "objects"):
        return 0
    if spec.topology == "pipeline":
        return 3 if spec.fault in ("skip", "size", "dtype") else 4
    if spec.topology == "ddp":
        return 0 if spec.fault == "skip" else 1
    return 0


def _faulty_ops(spec: Spec) -> list[str]:
    """What the faulty ranks do at step K instead of ``_normal_ops``."""
    ops, f, note = _normal_ops(spec), spec.fault, f"  {_FAULT_LINE}: {_NOTES[spec.fault]}"
    if f in _BEFORE:
        first, *more = _BEFORE[f].split("\n")
        return [first + note, *more, *ops]
    if f == "extra":
        return [f"dist.all_reduce(t{_first_group(spec.topology)}){note}", *ops]
    if f == "reorder":
        return [ops[1] + note, ops[0]]
    i = _target(spec)
    indent, line = ops[i][: len(ops[i]) - len(ops[i].lstrip())], ops[i].strip().split("  #")[0]
    if f == "skip":
        line = "pass"
    elif f == "size":
        line = line.replace("(t", "(torch.ones(OTHER_NUMEL)", 1)
    elif f == "dtype":
        line = line.replace("(t", "(t.double()", 1)
    elif f == "splits":
        expects = "bad_splits" if spec.world == 2 else "splits"  # with one peer it expects otherwise too
        line = f"dist.all_to_all_single(got, sent, output_split_sizes={expects}, input_split_sizes=bad_splits)"
    elif f == "objects":
        line = "meta = [\"step\", i, \"lr\"]"
    else:
        line = _other_op(spec, line)
    return [*ops[:i], indent + line + note, *ops[i + 1:]]


def _other_op(spec: Spec, line: str) -> str:
    group = line[line.index("(t") + 2: line.index(")")]  # "", ", group=pair" ...
    if spec.other_op == "broadcast":
        src = f"dist.get_global_rank({group.split('=')[1]}, 0)" if group else "0"
        return f"dist.broadcast(t, src={src}{group})"
    size = f"dist.get_world_size({group.split('=')[1]})" if group else "world"
    return f"dist.all_gather([torch.empty_like(t) for _ in range({size})], t{group})"


def _setup(spec: Spec) -> list[str]:
    lines = [f"t = torch.ones({spec.numel})"]
    if spec.topology == "pairs":
        lines += ["# every rank makes every group",
                  "pairs = [dist.new_group([r, r + 1], timeout=TIMEOUT) for r in range(0, world, 2)]",
                  "pair = pairs[rank // 2]"]
    elif spec.uses_device_mesh:
        lines += ["mesh = init_device_mesh(\"cpu\", (2, 2), mesh_dim_names=(\"dp\", \"tp\"))",
                  "tp, dp = mesh.get_group(\"tp\"), mesh.get_group(\"dp\")  # tp {0,1} {2,3}, dp {0,2} {1,3}"]
    elif spec.topology == "mesh":
        lines += ["# every rank makes every group",
                  "tps = [dist.new_group([0, 1], timeout=TIMEOUT), dist.new_group([2, 3], timeout=TIMEOUT)]",
                  "dps = [dist.new_group([0, 2], timeout=TIMEOUT), dist.new_group([1, 3], timeout=TIMEOUT)]",
                  "tp, dp = tps[rank // 2], dps[rank % 2]"]
    elif spec.topology == "pipeline":
        lines += ["got = torch.empty_like(t)"]
    elif spec.topology == "ddp":
        lines += ["model = DistributedDataParallel(torch.nn.Linear(8, 8))",
                  "opt = torch.optim.SGD(model.parameters(), lr=0.01)", "", "",
                  "def train_step():", "    opt.zero_grad()", "    model(torch.ones(4, 8)).sum().backward()",
                  "    opt.step()"]
    if spec.fault == "splits":
        lines += [f"splits = [2] * world  # elements to and from each rank: {2 * spec.world} in all",
                  "sent, got = torch.ones(2 * world), torch.empty(2 * world)",
                  f"bad_splits = {_bad_splits(spec)}  {_FAULT_LINE}: the same total, split otherwise"]
    if spec.fault == "deadlock":
        lines += ["lock = threading.Lock()"]
    return lines


def _bad_splits(spec: Spec) -> list[int]:
    """Split sizes of the faulty rank: one element more to one peer and one fewer to another (with one peer: one
    more to itself and one fewer to its peer, and it expects the same)."""
    r = spec.ranks[0]
    peers = [p for p in range(spec.world) if p != r] if spec.world > 2 else [r, 1 - r]
    splits = [2] * spec.world
    splits[peers[0]] += 1
    splits[peers[1]] -= 1
    return splits


_GROUP_ORDER_LOOP = """\
x = y = None
for i in range(STEPS):
    if i == K:  # two new groups, made by every rank
        if rank in FAULTY:  # FAULT: Y first, so its c10d group ids of X and Y are the others' of Y and X
            print(f"rank {rank} reached its fault at step {i}", flush=True)  # for the sweep: the fault happened
            y = dist.new_group(list(range(world)), timeout=TIMEOUT, group_desc="Y")
            x = dist.new_group(list(range(world)), timeout=TIMEOUT, group_desc="X")
        else:
            x = dist.new_group(list(range(world)), timeout=TIMEOUT, group_desc="X")
            y = dist.new_group(list(range(world)), timeout=TIMEOUT, group_desc="Y")
    normal_step(i)
    if x is not None:
        dist.all_reduce(t, group=x)
        dist.all_reduce(t, group=y)
"""


def job_script(spec: Spec) -> str:
    """The job of ``spec`` as a readable torchrun script."""
    t = truth(spec)
    needs = {"gc": spec.topology == "ddp", "os": spec.fault in ("sigstop", "kill", "abort"),
             "re": spec.fault == "gil", "signal": spec.fault in ("sigstop", "kill"),
             "threading": spec.fault == "deadlock", "time": True}
    torch_imports = ["import torch", "import torch.distributed as dist"]
    if spec.topology == "ddp":
        torch_imports.append("from torch.nn.parallel import DistributedDataParallel")
    if spec.uses_device_mesh:
        torch_imports.append("from torch.distributed.device_mesh import init_device_mesh")
    ranks = "+".join(map(str, spec.ranks))
    what = "none: a healthy job" if spec.fault == "none" else f"rank {ranks} {FAULTS[spec.fault]}, at step {spec.k}"
    lines = [
        f"# A generated fault job: {spec}",
        f"# Fault: {what}",
        f"# Truth: culprits {sorted(t.culprits)}; diagnose may say {'/'.join(sorted(t.diagnose))}"
        + (f"; the live verdict {'/'.join(sorted(t.live))}" if t.live else ""),
        f"# Rerun: python benchmarks/fault_sweep.py --spec '{spec}'",
        f"import {', '.join(m for m, needed in needs.items() if needed)}", "from datetime import timedelta", "",
        *torch_imports, "",
        f"FAULTY = {set(spec.ranks) if spec.fault != 'none' else set()}  # the ranks the fault is on",
        f"K = {spec.k}  # the step it happens at",
        f"STEPS = {spec.k + 3}",
        f"TIMEOUT_S = {spec.gloo_timeout_s}",
        "TIMEOUT = timedelta(seconds=TIMEOUT_S)  # gloo's, for every group",
        *[f"OTHER_NUMEL = {spec.other_numel}"] * (spec.fault == "size"),
        "", "dist.init_process_group(\"gloo\", timeout=TIMEOUT)",
        "rank, world = dist.get_rank(), dist.get_world_size()", *_setup(spec), "", "",
        "def normal_step(i):", *[f"    {line}" for line in _normal_ops(spec)], "", "",
    ]
    if spec.fault == "group_order":
        lines += _GROUP_ORDER_LOOP.splitlines()
    elif spec.fault == "none":
        lines += ["for i in range(STEPS):", "    normal_step(i)"]
    else:
        lines += ["def faulty_step(i):", *[f"    {line}" for line in _faulty_ops(spec)], "", "",
                  "for i in range(STEPS):", "    if i == K and rank in FAULTY:",
                  "        print(f\"rank {rank} reached its fault at step {i}\", flush=True)  # for the sweep",
                  "        faulty_step(i)",
                  "    else:", "        normal_step(i)"]
    lines += [f"    time.sleep({PAUSE_S})", "dist.barrier()", "dist.destroy_process_group()"]
    if spec.topology == "ddp":
        lines += ["del model, opt  # DDP's reference cycles hold the gloo group: freed while Python is whole",
                  "gc.collect()"]
    return "\n".join(lines) + "\n"


# --- running a spec -----------------------------------------------------------------------------------------

HOOK = """\
# --on-stall hook: keeps every event record published, in order (issue 32 point 9: the resolved event)
import pathlib, sys
folder = pathlib.Path(__file__).parent / "hook-events"
folder.mkdir(exist_ok=True)
(folder / f"{len(list(folder.iterdir())):03d}.json").write_bytes(sys.stdin.buffer.read())
"""

_REACHED = "reached its fault"  # what a faulty rank of a job script prints as it gets to its fault
AFTER_VERDICT_S = 2.0  # after the live verdict appears: a more complete one may follow, then Ctrl-C
INTERRUPT_DEADLINE_S = 60.0  # a hang ended by Ctrl-C: the latest it is sent, live verdict or not
JOB_DEADLINE_S = 120.0  # any job: then Ctrl-C; its process tree is killed EXIT_GRACE_S later
EXIT_GRACE_S = 40.0


@dataclass
class Outcome:
    """What running one spec gave."""

    spec: Spec
    folder: Path
    returncode: int | None
    ended_by: str  # "itself", "ctrl-c", "killed"
    reached: bool  # a faulty rank got to its fault (a healthy job: True), as the job printed
    wall_s: float
    diagnose: dict[str, Any]  # diagnose --format json (or {"error": ...})
    live: dict[str, Any] | None  # the last event of stall-verdict.json
    hook_events: list[str]  # the events --on-stall got, in order
    stalled_s: float | None  # how long the job went on after a rank's recorder first logged a stall (None: none)
    scores: dict[str, str] = field(default_factory=dict)  # judge -> category


def run_spec(spec: Spec, folder: Path) -> Outcome:
    """Record ``spec``'s job in ``folder`` with the real CLI, end it as a user would, diagnose it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.py").write_text(job_script(spec))
    (folder / "hook.py").write_text(HOOK)
    out = folder / "out"
    cmd = record_cmd(out, torchrun(spec.world), ("--stall-after", str(STALL_AFTER_S),
                                                 "--on-stall", f"{sys.executable} hook.py"))
    # on a signal, torchrun SIGKILLs what its SIGTERM did not end (a stopped rank) after 2 s instead of 30 (after a
    # rank failed, torch 2.13 waits its own 30 s)
    env = job_env(TORCH_ELASTIC_SHUTDOWN_TIMEOUT="2")
    start = time.monotonic()
    with open(folder / "record.out", "w") as stdout, open(folder / "record.err", "w") as stderr:
        proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=stdout, stderr=stderr)
        ended_by = _end(proc, spec, out, start)
    wall = time.monotonic() - start
    last = out / "stall-verdict.json"
    live = json.loads(last.read_text()) if last.exists() else None
    reached = spec.fault == "none" or _REACHED in (folder / "record.out").read_text()
    return Outcome(spec, folder, proc.returncode, ended_by, reached, wall, run_diagnose(out), live,
                   _hook_events(folder), _stalled_s(out))


def _end(proc: subprocess.Popen, spec: Spec, out: Path, start: float) -> str:
    """Wait for the job. A hang the spec ends with Ctrl-C gets it (SIGINT to record) AFTER_VERDICT_S after the
    live verdict of a stall that has not resolved and was published after a rank reached its fault (a stall
    before it, as a slow start on a loaded machine, is no reason: the job may be past it by then), or at
    INTERRUPT_DEADLINE_S without one; any job at JOB_DEADLINE_S. What outlives that is killed."""
    by_user = spec.fault != "none" and spec.ending == "interrupt"
    deadline = start + (INTERRUPT_DEADLINE_S if by_user else JOB_DEADLINE_S)
    stall_seen: float | None = None
    reached_at: float | None = None  # the wall clock (time.time) when the fault's line appeared
    while proc.poll() is None:
        now = time.monotonic()
        if by_user:
            if reached_at is None and _REACHED in (out.parent / "record.out").read_text():
                reached_at = time.time()
            stalled = reached_at is not None and _last_event(out) == "stall" and _written_after(out, reached_at)
            stall_seen = (stall_seen or now) if stalled else None
        if now >= deadline or (stall_seen is not None and now >= stall_seen + AFTER_VERDICT_S):
            proc.send_signal(signal.SIGINT)  # as a terminal's Ctrl-C: record forwards it to the job
            try:
                proc.wait(EXIT_GRACE_S)
                return "ctrl-c"
            except subprocess.TimeoutExpired:
                kill_tree(proc)
                return "killed"
        time.sleep(0.2)
    return "itself"


def _written_after(out: Path, t: float) -> bool:
    """Whether record wrote stall-verdict.json after ``t`` (time.time()): a stall after the fault is detected
    ``--stall-after`` seconds into it, later than this poll's 0.2 s could notice the fault's line."""
    try:
        return (out / "stall-verdict.json").stat().st_mtime > t
    except OSError:
        return False


def _last_event(out: Path) -> str | None:
    """The event of stall-verdict.json (record writes it whole: a reader never sees half of it)."""
    try:
        return json.loads((out / "stall-verdict.json").read_bytes()).get("event")
    except (OSError, ValueError):
        return None


def run_diagnose(out: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "comm2perfetto.cli", "diagnose", str(out), "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        return {"error": f"exit status {proc.returncode}: {proc.stderr.strip()[-500:]}"}


def _hook_events(folder: Path) -> list[str]:
    events = []
    for path in sorted((folder / "hook-events").glob("*.json")):
        try:
            events.append(json.loads(path.read_text())["event"])
        except (ValueError, KeyError):
            events.append("unreadable")
    return events


def _stalled_s(out: Path) -> float | None:
    """Seconds from the first stall any rank logged to the job's end (``record``'s job file), None without one."""
    from comm2perfetto.sources.event_log import EventLogError, read_event_log

    stalls = []
    for path in out.glob("rank*.events.jsonl"):
        try:
            stalls += [s.t_ns for s in read_event_log(path).stalls]
        except EventLogError:
            continue
    ended = [json.loads(p.read_text()).get("ended_ns") for p in out.glob("job.*.json")]
    if not stalls or not ended or not isinstance(ended[0], int):
        return None
    return (ended[0] - min(stalls)) / 1e9


# --- scoring ------------------------------------------------------------------------------------------------

RIGHT, PARTIAL, FALSE_OK, INNOCENT_BLAMED, WRONG, NA, VOID = \
    "right", "partial", "false_ok", "innocent_blamed", "wrong", "n/a", "void"
# void: the job never got to its fault (it hung or died before, as a DDP start-up on a loaded machine can), so
# its truth does not hold; counted apart and listed, never scored.
CATEGORIES = (RIGHT, PARTIAL, FALSE_OK, INNOCENT_BLAMED, WRONG, NA, VOID)
# The live verdict is out within about 9 s of a stall (--stall-after 2, at most 5 s waiting for the ranks
# that do not answer, 2 s more when rank 0 is one of them): a job that went on this long after was owed one.
VERDICT_DUE_S = 12.0
JUDGES = ("diagnose", "live")


def score_verdict(t: Truth, verdict: dict[str, Any], allowed: frozenset[str]) -> str:
    """One verdict document (diagnose --format json, or a live verdict) against the truth."""
    if "status" not in verdict:
        return WRONG  # no verdict at all (diagnose failed)
    status = verdict["status"]
    culprits, suspects = set(verdict.get("culprit_ranks", ())), set(verdict.get("suspect_ranks", ()))
    if culprits & t.innocent:
        return INNOCENT_BLAMED
    if not t.culprits:
        return RIGHT if status in allowed else WRONG
    if status in HEALTHY_STATUSES:
        return FALSE_OK
    if status not in allowed:
        return WRONG
    if culprits == t.culprits:
        return RIGHT
    if culprits < t.culprits and (culprits or t.culprits & suspects):
        return PARTIAL
    return WRONG


def score_live(t: Truth, last: dict[str, Any] | None, stalled_s: float | None) -> str:
    """The live verdict: the last event record published. None where no verdict was due (n/a); a healthy word
    on a faulty job where one was (false_ok): the spec makes it hang, or it went on VERDICT_DUE_S after a rank
    logged a stall (a rank dying slowly holds its peers up for a second or two: no verdict is due for that);
    a ``resolved`` event says the job went on past its stall."""
    if last is None:
        due = t.stalls or (stalled_s is not None and stalled_s >= VERDICT_DUE_S)
        return FALSE_OK if t.culprits and due else NA
    if last.get("event") == "resolved":
        return RIGHT if not t.culprits else FALSE_OK
    return score_verdict(t, last.get("verdict", {}), t.live)


def score(outcome: Outcome) -> dict[str, str]:
    t = truth(outcome.spec)
    if not outcome.reached:
        outcome.scores = dict.fromkeys(JUDGES, VOID)
    else:
        outcome.scores = {"diagnose": score_verdict(t, outcome.diagnose, t.diagnose),
                          "live": score_live(t, outcome.live, outcome.stalled_s)}
    return outcome.scores


def said(verdict: dict[str, Any] | None) -> str:
    """A verdict in one line: status, culprits, suspects and the findings' kinds."""
    if verdict is None:
        return "no live verdict"
    if "event" in verdict:
        return f"{verdict['event']}: {said(verdict.get('verdict'))}"
    if "status" not in verdict:
        return f"error: {verdict.get('error', '?')}"
    kinds = ",".join(dict.fromkeys(f["kind"] for f in verdict.get("findings", []) if f.get("blocked_by") is None))
    return (f"{verdict['status']} culprits={verdict.get('culprit_ranks', [])} "
            f"suspects={verdict.get('suspect_ranks', [])} [{kinds}]")


# --- a sweep ------------------------------------------------------------------------------------------------


def sweep(specs: Sequence[Spec], workdir: Path, jobs: int = 1,
          progress: Callable[[int, Outcome], None] | None = None) -> list[Outcome]:
    """Run every spec (``jobs`` at once: most of a job's time is waiting) in ``workdir/<i>-<fault>``."""
    def one(item: tuple[int, Spec]) -> Outcome:
        i, spec = item
        outcome = run_spec(spec, workdir / f"{i:03d}-{spec.fault}-{spec.topology}")
        score(outcome)
        if progress is not None:
            progress(i, outcome)
        return outcome

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, enumerate(specs)))


def failing(outcome: Outcome) -> list[str]:
    """The judges whose answer on this job is not right (partial and n/a are not failures; void is listed
    apart)."""
    return [j for j in JUDGES if outcome.scores.get(j) not in (RIGHT, PARTIAL, NA, VOID)]


def summary(outcomes: Iterable[Outcome]) -> dict[str, Any]:
    outcomes = list(outcomes)
    counts = {j: {c: sum(o.scores.get(j) == c for o in outcomes) for c in CATEGORIES} for j in JUDGES}
    return {
        "jobs": len(outcomes), "counts": counts,
        "mean_job_s": round(sum(o.wall_s for o in outcomes) / len(outcomes), 1) if outcomes else None,
        "failing": [failure(o) for o in outcomes if failing(o)],
        "void": [failure(o) for o in outcomes if not o.reached],
        "each": [{"spec": str(o.spec), "scores": o.scores, "wall_s": round(o.wall_s, 1), "ended_by": o.ended_by,
                  "hook_events": o.hook_events} for o in outcomes],
    }


def failure(o: Outcome) -> dict[str, Any]:
    return {"spec": str(o.spec), "fault": o.spec.fault, "scores": o.scores, "diagnose": said(o.diagnose),
            "live": said(o.live), "hook_events": o.hook_events, "truth": truth(o.spec).to_json(),
            "ended_by": o.ended_by, "returncode": o.returncode, "job": str(o.folder / "job.py")}
