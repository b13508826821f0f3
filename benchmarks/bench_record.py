"""How much recording costs a training job: the patch layer per call, module tracking, and a DDP step.

Four parts, each against a baseline measured in the same run (figures only; nothing here asserts a timing):

a) Patch layer: per-call time of ``dist.all_reduce`` on a 1-float tensor over gloo, the original function
   against the wrapper installed by ``comm2perfetto.enable()`` (recording), in blocks of calls interleaved so
   that drift (frequency scaling, other processes) hits both alike. World size 1 is the clean figure: a 2-rank
   gloo all-reduce costs a few hundred microseconds and its jitter exceeds the wrapper's cost. World size 2 is
   measured too. A plain Python pass-through wrapper is timed alongside as the floor any wrapper pays.
   The headline figure is the recording wrapper around a no-op function against the no-op itself: the patch
   layer's own cost, which the collective's jitter cannot hide or inflate. Target: at most 3 us per call.
   At world size 1 it also times the C-level operations every recorded call needs (clock, sequence counter,
   caller frame, shape and dtype, serialising and appending a record), in a tight loop and right after an
   all_reduce: how much slower any code runs once a collective has left the caches cold.

b) DDP step time: ``examples/ddp_train.py --report-step-time --bind-cpu`` under torchrun with 2 ranks, plain
   and under ``comm2perfetto record``, alternating; the median of the paired ratios with its 95 % bootstrap
   interval. Target: at most 2 % slower. Separate runs on this 2-core machine scatter by several percent.

c) Module tracking: the cost per nn.Module call of the recorder's module hooks (context.ModuleTracker), on a
   Sequential of Linear layers, forward only and forward + backward, tracked and plain in interleaved rounds.

d) The same DDP step in one process at world size 1, recording switched on and off (``enable()`` /
   ``disable()``) between blocks of steps: the recorder's cost per step in isolation, resolved to a few
   tenths of a percent. Same target.

e) The dispatcher fallback (record/dispatch.py: what records DDP's C++-issued collectives on gloo where torch
   2.4-2.7 have no Flight Recorder for it; forced on newer torch), at world size 1 in one process: per
   collective, ``ProcessGroup.allreduce`` of a 1-float tensor (how C++ callers reach c10d, no Python patch on
   the way) bare, through the kernel recording it, and ``dist.all_reduce`` recorded by the patch layer with and
   without the kernel (which it then passes unrecorded); per DDP step, against plain blocks of steps: each hook
   that sees DDP's collectives passing through without recording (the fallback's kernel, a TorchDispatchMode
   around backward, DDP's Python all-reduce comm hook on a second model: what the mechanism alone costs), then
   recording without and with the fallback. Also whether wrapping ``ProcessGroup.allreduce`` and friends in
   Python sees any of DDP's calls. Wall time, and CPU time (steadier on a shared machine).

    python benchmarks/bench_record.py                  # full run, a few minutes
    python benchmarks/bench_record.py --only patch     # one part: patch, modules, ddp, blocks or fallback
    python benchmarks/bench_record.py --quick          # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

from comm2perfetto.record.config import DEFAULT_FR_BUFFER

REPO = Path(__file__).resolve().parent.parent
DDP_SCRIPT = REPO / "examples" / "ddp_train.py"
PATCH_TARGET_US = 3.0
STEP_TARGET_PCT = 2.0
STEP_TIME_RE = re.compile(r"step_time_ms median=[0-9.]+ mean=([0-9.]+)")

# Variants of the patch-layer measurement, in table order.
UNPATCHED, PASSTHROUGH, RECORDING = "unpatched", "python pass-through", "recording"
# The wrapper around a function that does nothing: the patch layer's own cost, free of gloo's noise.
NOOP, NOOP_RECORDING = "no-op", "recording no-op"
# A control: about 1 us of unrelated Python work before each all_reduce. Back-to-back gloo calls are faster
# than calls with anything in between (gloo's worker thread is still awake), so any wrapper that does work
# pays this once; the recorder's cost is the difference to this line, not to the bare call.
BUSY = "1 us work + call"


# --- a) patch layer ---------------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port that was free a moment ago on localhost (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def time_calls(fn: Callable, arg: object, calls: int, out: list[int]) -> None:
    """Append the duration in ns of each of ``calls`` calls ``fn(arg)`` to ``out``."""
    clock, append = time.perf_counter_ns, out.append
    for _ in range(calls):
        start = clock()
        fn(arg)
        append(clock() - start)


def count_recorded(out_dir: Path, rank: int, op: str) -> int | None:
    """How many ``op`` calls rank ``rank``'s event log holds; None when there is no log."""
    log = out_dir / f"rank{rank}.events.jsonl"
    if not log.exists():
        return None
    count = 0
    for line in log.read_text(encoding="utf-8", errors="replace").rstrip("\0").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn last line
        if isinstance(record, list) and record[:1] == ["b"] and len(record) > 3 and record[3] == op:
            count += 1
    return count


def primitive_costs(collective: Callable[[], object], counter: Callable[[], int], tensor: object,
                    samples: int = 3000) -> dict[str, tuple[float, float]]:
    """Median ns of each C-level operation a recorded call needs, warm (in a tight loop) and right after
    ``collective()``, less the cost of timing an empty call. Shows how much of the wrapper's cost around a real
    call is the caches the collective left cold, whatever language the wrapper is written in."""
    import mmap

    import orjson

    log = mmap.mmap(-1, 1 << 24)
    record = ["b", 1, time.time_ns(), "all_reduce", 0, 1, None, False, 139911, 1, 0, 3, 1]
    data = orjson.dumps(record, None, orjson.OPT_APPEND_NEWLINE)
    operations: dict[str, Callable[[], object]] = {
        "empty": lambda: None,
        "clock": time.time_ns,
        "sequence counter": counter,
        "caller frame": lambda: sys._getframe(1),
        "shape and dtype": lambda: (tensor.shape, tensor.dtype),  # type: ignore[attr-defined]
        "serialise a record": lambda: orjson.dumps(record, None, orjson.OPT_APPEND_NEWLINE),
        "append it to the log": lambda: log.write(data),
    }
    clock = time.perf_counter_ns
    out: dict[str, tuple[float, float]] = {}
    for name, operation in operations.items():
        medians = []
        for cold in (False, True):
            durations = []
            for _ in range(samples):
                if cold:
                    collective()
                start = clock()
                operation()
                durations.append(clock() - start)
            log.seek(0)
            medians.append(statistics.median(durations))
        out[name] = (medians[0], medians[1])
    empty = out.pop("empty")
    return {name: (warm - empty[0], cold - empty[1]) for name, (warm, cold) in out.items()}


# A recorded call reads the clock and serialises and appends a record twice (its call and its return).
PRIMITIVES_PER_CALL = {"clock": 2, "sequence counter": 1, "caller frame": 1, "shape and dtype": 1,
                       "serialise a record": 2, "append it to the log": 2}


def overhead_rank(rank: int, world_size: int, port: int, calls: int, block: int, work_dir: str) -> None:
    """One rank of the patch-layer measurement; writes ``result.<rank>.json`` into ``work_dir``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist

    import comm2perfetto

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    tensor = torch.ones(1)
    original = dist.all_reduce

    def passthrough(*args: object, **kwargs: object) -> object:
        return original(*args, **kwargs)

    def noop(tensor: object, op: object = None, group: object = None, async_op: bool = False) -> None:
        return None

    def busy_then_call(*args: object, **kwargs: object) -> object:
        total = 0
        for i in range(40):  # about 1 us here
            total += i
        return original(*args, **kwargs)

    from comm2perfetto.record import ops
    from comm2perfetto.record.recorder import recording_wrapper

    names_all = (UNPATCHED, PASSTHROUGH, BUSY, RECORDING, NOOP, NOOP_RECORDING)
    samples: dict[str, list[int]] = {name: [] for name in names_all}
    block_medians: dict[str, list[float]] = {name: [] for name in names_all}
    time_calls(original, tensor, block, [])  # warm-up before the recorder exists

    record_dir = Path(work_dir) / f"record-ws{world_size}"
    comm2perfetto.enable(str(record_dir))  # the defaults a user gets
    recording = dist.all_reduce
    recording_noop = recording_wrapper(ops.bind(next(s for s in ops.OPS if s.name == "all_reduce"), noop), noop)
    variants = {UNPATCHED: original, PASSTHROUGH: passthrough, BUSY: busy_then_call, RECORDING: recording,
                NOOP: noop, NOOP_RECORDING: recording_noop}
    names = list(variants)
    time_calls(recording, tensor, block, [])  # warm-up: first recorded calls declare the group, intern sites

    # Every rank runs the same sequence, so in the 2-rank case the ranks call the same variant in lockstep.
    for round_no in range(max(1, calls // block)):
        rotation = names[round_no % len(names):] + names[: round_no % len(names)]  # no variant always first
        for name in rotation:
            block_ns: list[int] = []
            time_calls(variants[name], tensor, block, block_ns)
            samples[name] += block_ns
            block_medians[name].append(statistics.median(block_ns))

    comm2perfetto.disable()
    primitives = {}
    if world_size == 1:
        import torch.distributed.distributed_c10d as c10d

        counter = c10d._get_default_group()._get_sequence_number_for_group
        primitives = primitive_costs(lambda: original(tensor), counter, tensor)
    result = {
        "primitives_ns": primitives,
        "rank": rank,
        "world_size": world_size,
        "calls": {name: len(values) for name, values in samples.items()},
        "median_ns": {name: statistics.median(values) for name, values in samples.items()},
        # The mean keeps what the median leaves out: first sightings, growing the log, the odd page fault.
        "mean_ns": {name: statistics.fmean(values) for name, values in samples.items()},
        # Paired by round: neighbouring blocks share the machine's state, so their difference drifts less.
        "block_overhead_ns": [r - u for r, u in zip(block_medians[RECORDING], block_medians[UNPATCHED])],
        "noop_overhead_ns": [r - u for r, u in zip(block_medians[NOOP_RECORDING], block_medians[NOOP])],
        "wrapped": recording is not original,
        "restored": dist.all_reduce is original,
        "recorded_calls": count_recorded(record_dir, rank, "all_reduce"),
        "expected_recorded": block + len(samples[RECORDING]) + len(samples[NOOP_RECORDING]),
    }
    dist.destroy_process_group()
    (Path(work_dir) / f"result.{rank}.json").write_text(json.dumps(result))


def measure_patch_layer(world_size: int, calls: int, block: int) -> list[dict]:
    """Run the measurement in ``world_size`` fresh processes; return each rank's result, rank 0 first."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="c2p-bench-") as work_dir:
        mp.spawn(overhead_rank, args=(world_size, free_port(), calls, block, work_dir), nprocs=world_size)
        return [json.loads((Path(work_dir) / f"result.{r}.json").read_text()) for r in range(world_size)]


def overhead_us(result: dict, key: str = "block_overhead_ns") -> tuple[float, float, float]:
    """The wrapper's cost per call: median of the paired block differences, with their quartiles (us)."""
    diffs = result[key]
    if len(diffs) < 2:
        return diffs[0] / 1000, diffs[0] / 1000, diffs[0] / 1000
    q1, median, q3 = statistics.quantiles(diffs, n=4)
    return median / 1000, q1 / 1000, q3 / 1000


def report_patch_layer(per_world: list[list[dict]]) -> None:
    """Print rank 0's per-call table, any rank's contract problems and the headline overhead line."""
    results = [ranks[0] for ranks in per_world]
    print(f"{'world':>5}  {'calls':>6}  {UNPATCHED + ' us':>14}  {PASSTHROUGH + ' us':>22}  "
          f"{BUSY + ' us':>19}  {RECORDING + ' us':>14}  {'ratio':>6}  {'overhead us (block quartiles)':>30}")
    for res in results:
        med = {name: ns / 1000 for name, ns in res["median_ns"].items()}
        cost, q1, q3 = overhead_us(res)
        print(f"{res['world_size']:>5}  {res['calls'][RECORDING]:>6}  {med[UNPATCHED]:>14.2f}  "
              f"{med[PASSTHROUGH]:>22.2f}  {med[BUSY]:>19.2f}  {med[RECORDING]:>14.2f}  "
              f"{med[RECORDING] / med[UNPATCHED]:>6.3f}  {cost:>11.2f} ({q1:.2f} .. {q3:.2f})")
    for res in (res for ranks in per_world for res in ranks):
        problems = []
        if not res["wrapped"]:
            problems.append("enable() did not replace torch.distributed.all_reduce")
        if not res["restored"]:
            problems.append("disable() did not restore the original torch.distributed.all_reduce")
        if res["recorded_calls"] is None:
            problems.append("no event log was written")
        elif res["recorded_calls"] < res["expected_recorded"]:
            problems.append(f"event log holds {res['recorded_calls']} all_reduce calls, "
                            f"expected {res['expected_recorded']}")
        for problem in problems:
            print(f"  world {res['world_size']} rank {res['rank']}: WARNING: {problem}")
    clean = results[0]
    noop = {name: clean["median_ns"][name] / 1000 for name in (NOOP, NOOP_RECORDING)}
    cost, q1, q3 = overhead_us(clean, "noop_overhead_ns")
    verdict = "ok" if cost <= PATCH_TARGET_US else "OVER TARGET"
    mean = {name: clean["mean_ns"][name] / 1000 for name in (NOOP, NOOP_RECORDING)}
    print(f"around a no-op: {noop[NOOP]:.2f} us bare, {noop[NOOP_RECORDING]:.2f} us through the recording "
          f"wrapper (means {mean[NOOP]:.2f} and {mean[NOOP_RECORDING]:.2f} us)")
    print(f"patch overhead: {cost:.2f} us/call around a no-op (block quartiles {q1:.2f} .. {q3:.2f}; "
          f"target <= {PATCH_TARGET_US:g} us): {verdict}")
    med = {name: ns / 1000 for name, ns in clean["median_ns"].items()}
    print(f"with gloo at world size {clean['world_size']}: {overhead_us(clean)[0]:.2f} us/call over the bare call, "
          f"{med[RECORDING] - med[BUSY]:.2f} us over the call after 1 us of other work (gloo's back-to-back "
          f"fast path is lost by any work in between)")
    primitives = clean.get("primitives_ns")
    if primitives:
        print("what a recorded call cannot do without, median ns: warm (tight loop) / right after an all_reduce")
        for name, (warm, cold) in primitives.items():
            times = f" (x{PRIMITIVES_PER_CALL[name]})" if PRIMITIVES_PER_CALL[name] > 1 else ""
            print(f"  {name + times:<28} {warm:>6.0f} / {cold:>6.0f}")
        warm_sum = sum(PRIMITIVES_PER_CALL[n] * w for n, (w, _c) in primitives.items()) / 1000
        cold_sum = sum(PRIMITIVES_PER_CALL[n] * c for n, (_w, c) in primitives.items()) / 1000
        print(f"  sum per call: {warm_sum:.2f} us warm, {cold_sum:.2f} us right after a collective, before the "
              f"wrapper's own code")


# --- c) module tracking ---------------------------------------------------------------------------------------


def measure_modules(layers: int, rounds: int, calls: int) -> None:
    """Cost per module call of the recorder's module tracking: a Sequential of ``layers`` Linear(8, 8) run
    with and without the tracker's hooks, in interleaved rounds, forward only and forward + backward."""
    import torch
    from torch import nn

    from comm2perfetto.record.context import ModuleTracker

    def fail(exc: BaseException) -> None:
        raise exc

    torch.set_num_threads(1)
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(layers)])
    x = torch.randn(4, 8, requires_grad=True)
    module_calls = layers + 1  # the Sequential too
    workloads = {"forward": lambda: model(x), "forward + backward": lambda: model(x).sum().backward()}
    for label, work in workloads.items():
        times: dict[str, list[float]] = {"plain": [], "tracked": []}
        for round_no in range(rounds):
            for variant in (("plain", "tracked") if round_no % 2 == 0 else ("tracked", "plain")):
                tracker = ModuleTracker(fail)
                if variant == "tracked":
                    tracker.install()
                try:
                    work()  # warm-up: the first call of each module computes its path
                    start = time.perf_counter_ns()
                    for _ in range(calls):
                        work()
                    times[variant].append((time.perf_counter_ns() - start) / calls)
                finally:
                    tracker.uninstall()
        plain, tracked = statistics.median(times["plain"]), statistics.median(times["tracked"])
        print(f"{label:>18}: {plain / 1000:8.1f} us plain, {tracked / 1000:8.1f} us tracked: "
              f"{(tracked - plain) / module_calls / 1000:.2f} us per module call")


# --- b) DDP step time ---------------------------------------------------------------------------------------------


def find_command(name: str) -> str:
    """The console script ``name`` of this Python environment, else the one on PATH."""
    local = Path(sys.executable).with_name(name)
    found = str(local) if local.exists() else shutil.which(name)
    if found is None:
        raise SystemExit(f"bench_record: cannot find `{name}`; install the project (pip install -e .) first")
    return found


def plain_env() -> dict[str, str]:
    """This environment without comm2perfetto's settings, so the baseline run records nothing."""
    return {k: v for k, v in os.environ.items() if not k.startswith("COMM2PERFETTO_")}


def run_ddp(command: list[str], label: str) -> float | None:
    """Run one DDP job; return rank 0's mean step time in ms, or None (with the reason printed)."""
    proc = subprocess.run(command, capture_output=True, text=True, env=plain_env(), timeout=600)
    match = STEP_TIME_RE.search(proc.stdout)
    if proc.returncode != 0 or match is None:
        tail = "\n    ".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        print(f"  {label} run failed (exit status {proc.returncode}):\n    {tail}")
        return None
    return float(match.group(1))


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def bootstrap_interval(values: Sequence[float], confidence: float = 0.95, resamples: int = 10_000,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the median of ``values`` (no distribution assumed)."""
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    tail = (1 - confidence) / 2
    return medians[int(tail * resamples)], medians[min(resamples - 1, int((1 - tail) * resamples))]


def step_verdict(ratios: Sequence[float], more: str = "--repeats") -> str:
    """Judge the recorded/plain ratios against the target by the 95 % interval of their median, not by one
    figure: a hiccup of the machine during one run moves the median less than the mean."""
    low, high = ((r - 1) * 100 for r in bootstrap_interval(ratios))
    interval = f"95 % interval {low:+.2f} % to {high:+.2f} %"
    if high <= STEP_TARGET_PCT:
        return f"{interval}: ok"
    if low > STEP_TARGET_PCT:
        return f"{interval}: OVER TARGET"
    return f"{interval}: not resolved at this precision (more {more}, a quieter machine)"


def measure_ddp(repeats: int, steps: int, batch: int) -> bool:
    """Alternate plain and recorded runs (ABBA order) and print their step times and ratio.

    Each rank is bound to one core (``--bind-cpu``): on a machine with as many cores as ranks, the scheduler
    otherwise moves ranks around and a run's step time jumps between two modes (~2.5 and ~3.7 ms here),
    which buries a 2 % difference. The figure per run is the mean step time, which such modes move less
    than the median. Returns False when a run failed (its output is printed)."""
    torchrun = find_command("torchrun")
    c2p = find_command("comm2perfetto")
    # --standalone: a free rendezvous port, so the benchmark never collides with another job on 29500.
    job = [torchrun, "--standalone", "--nproc_per_node", "2", str(DDP_SCRIPT), "--report-step-time",
           "--bind-cpu", "--epochs", "1", "--steps", str(steps), "--batch", str(batch)]
    times: dict[str, list[float]] = {"plain": [], "recorded": []}
    sizes: list[int] = []
    with tempfile.TemporaryDirectory(prefix="c2p-bench-ddp-") as tmp:
        for i in range(repeats):
            order = ["plain", "recorded"] if i % 2 == 0 else ["recorded", "plain"]
            for label in order:
                out_dir = Path(tmp) / f"run{i}"
                command = job if label == "plain" else [c2p, "record", "-o", str(out_dir), "--", *job]
                value = run_ddp(command, label)
                if value is None:
                    return False
                times[label].append(value)
                if label == "recorded":
                    sizes.append(dir_size(out_dir))
            print(f"  repeat {i + 1}/{repeats}: plain {times['plain'][-1]:.3f} ms, "
                  f"recorded {times['recorded'][-1]:.3f} ms", flush=True)

    print(f"{'':>9}  {'mean ms':>8}  {'median ms':>9}  {'min ms':>7}  {'max ms':>7}")
    for label, values in times.items():
        print(f"{label:>9}  {statistics.fmean(values):>8.3f}  {statistics.median(values):>9.3f}  "
              f"{min(values):>7.3f}  {max(values):>7.3f}")
    print(f"recorded output: {statistics.median(sizes) / 1024:.0f} KiB per run")
    # Each recorded run against the plain run next to it: slow drift of the machine cancels out.
    ratios = [r / p for r, p in zip(times["recorded"], times["plain"])]
    ratio = statistics.median(ratios)
    print(f"step time ratio: {ratio:.4f} (median of {len(ratios)} paired runs, {(ratio - 1) * 100:+.2f} %, "
          f"target <= +{STEP_TARGET_PCT:g} %), {step_verdict(ratios)}")
    return True


# --- d) DDP step in one job ----------------------------------------------------------------------------------


NO_STEP_HOOK = "recorded, no step hook"
BLOCK_VARIANTS = ["plain", "recorded", NO_STEP_HOOK]


def ddp_blocks_rank(rank: int, world_size: int, port: int, rounds: int, block: int, work_dir: str) -> None:
    """One rank: train the example's DDP model in blocks of ``block`` steps, recording switched on
    (``comm2perfetto.enable()``) and off (``disable()``) between blocks, the variants in rotating order. Writes
    the mean step time of each block, in ms, to ``blocks.<rank>.json``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # The ring size the recorder asks for, in both variants: the process group reads it once, at creation.
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(DEFAULT_FR_BUFFER)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import comm2perfetto
    from comm2perfetto.record import state

    sys.path.insert(0, str(DDP_SCRIPT.parent))
    from ddp_train import Net, train_step

    torch.set_num_threads(1)
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    model = DistributedDataParallel(Net())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(64, 1, 28, 28, generator=gen), torch.randint(0, 10, (64,), generator=gen))
               for _ in range(8)]

    def run_block(steps: int) -> float:
        for x, y in batches[:3]:  # settle after the switch, untimed
            train_step(model, optimizer, x, y)
        start = time.perf_counter_ns()
        for i in range(steps):
            x, y = batches[i % len(batches)]
            train_step(model, optimizer, x, y)
        return (time.perf_counter_ns() - start) / steps / 1e6

    run_block(block)  # warm-up: DDP buckets, allocator
    means: dict[str, list[float]] = {name: [] for name in BLOCK_VARIANTS}
    for round_no in range(rounds):
        shift = round_no % len(BLOCK_VARIANTS)  # no variant always first
        for variant in BLOCK_VARIANTS[shift:] + BLOCK_VARIANTS[:shift]:
            if variant != "plain":  # a fresh folder: enable() starts a new log
                comm2perfetto.enable(str(Path(work_dir) / f"round{round_no}-{len(means[variant])}-{variant}"))
                rec = state.recorder
                if variant == NO_STEP_HOOK:  # everything recording but the step boundary's own work
                    rec.steps.uninstall()
                    if rec.modules is not None:  # its switch-off is decided at a step boundary
                        rec.modules.uninstall()
                        rec.modules = None
            dist.barrier()
            means[variant].append(run_block(block))
            if variant != "plain":
                comm2perfetto.disable()
    dist.destroy_process_group()
    (Path(work_dir) / f"blocks.{rank}.json").write_text(json.dumps(means))


def measure_ddp_blocks(rounds: int, block: int, world_size: int = 1) -> None:
    """Part d: the DDP step with and without recording in the same process, block by block.

    Neighbouring blocks share everything that makes separate runs scatter (placement, memory layout, the
    machine's other load), and at world size 1 no other rank's jitter enters, so the difference resolves
    well under 1 %. It measures the recorder's work per step (the step hook and its log record, the check for
    a periodic Flight Recorder dump, watchdog ticks); one-off costs of starting (imports, clock sync, the
    first FR dump) are left out, as a long job would see them. A third variant records with the step hook
    removed: what is left is the cost of everything else. The step is shorter than at world size 2 (no
    peer to wait for), so the same per-step cost is a larger share of it."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="c2p-bench-blocks-") as work_dir:
        mp.spawn(ddp_blocks_rank, args=(world_size, free_port(), rounds, block, work_dir), nprocs=world_size)
        means = json.loads((Path(work_dir) / "blocks.0.json").read_text())
    print(f"{'':>22}  {'median ms':>9}  {'min ms':>7}  {'max ms':>7}")
    for label, values in means.items():
        print(f"{label:>22}  {statistics.median(values):>9.3f}  {min(values):>7.3f}  {max(values):>7.3f}")
    ratios = [r / p for r, p in zip(means["recorded"], means["plain"])]
    ratio = statistics.median(ratios)
    print(f"step time ratio: {ratio:.4f} (median of {len(ratios)} paired blocks, {(ratio - 1) * 100:+.2f} %, "
          f"target <= +{STEP_TARGET_PCT:g} %), {step_verdict(ratios, '--rounds')}")
    ratios = [r / p for r, p in zip(means[NO_STEP_HOOK], means["plain"])]
    low, high = ((r - 1) * 100 for r in bootstrap_interval(ratios))
    print(f"without the step hook: {(statistics.median(ratios) - 1) * 100:+.2f} % (95 % interval {low:+.2f} % to "
          f"{high:+.2f} %): the rest of the recorder's cost per step")


# --- e) the dispatcher fallback -------------------------------------------------------------------------------


FALLBACK_CALLS = ["bare C++-path call", "C++-path call, fallback recording", "dist.all_reduce, patch layer",
                  "dist.all_reduce, patch layer + fallback"]
# The hooks that see DDP's collectives, each passing through without recording (what the mechanism alone costs),
# then recording without and with the fallback.
FALLBACK_STEPS = ["plain", "fallback kernel, passing through", "dispatch mode around backward", "Python comm hook",
                  "recorded, no fallback", "recorded, fallback"]


def _with_recording(out_dir: str, fallback: bool) -> Callable[[], None]:
    """Start recording into ``out_dir`` with the fallback forced on or off; returns what stops it."""
    import comm2perfetto
    from comm2perfetto.record import mechanisms

    os.environ[mechanisms.ENV_FALLBACK] = "force" if fallback else "off"
    with contextlib.redirect_stderr(io.StringIO()):  # its start-up line, at every block
        comm2perfetto.enable(out_dir, stall_after=None)
    return comm2perfetto.disable


def fallback_rank(rank: int, world_size: int, port: int, rounds: int, block: int, steps: int, work_dir: str) -> None:
    """Part e, one process at world size 1; writes ``fallback.json`` into ``work_dir``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(DEFAULT_FR_BUFFER)  # the ring the recorder asks for, in every variant
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils._python_dispatch import TorchDispatchMode

    from comm2perfetto.record import dispatch
    from comm2perfetto.record.recorder import dispatcher_kernel

    sys.path.insert(0, str(DDP_SCRIPT.parent))
    from ddp_train import Net, train_step

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    group = dist.distributed_c10d._get_default_group()
    tensor = torch.ones(1)
    n = 0

    def folder() -> str:
        nonlocal n
        n += 1
        return str(Path(work_dir) / f"rec{n}")

    per_call = {
        FALLBACK_CALLS[0]: (None, lambda: group.allreduce([tensor]).wait()),
        FALLBACK_CALLS[1]: (True, lambda: group.allreduce([tensor]).wait()),
        FALLBACK_CALLS[2]: (False, lambda: dist.all_reduce(tensor)),
        FALLBACK_CALLS[3]: (True, lambda: dist.all_reduce(tensor)),
    }
    # Wall time, and the CPU time of the calling thread (what the kernel's Python costs it; steadier than wall
    # time on a machine other work shares).
    call_us: dict[str, list[float]] = {name: [] for name in per_call}
    call_cpu_us: dict[str, list[float]] = {name: [] for name in per_call}
    for round_no in range(rounds):
        names = list(per_call)[round_no % len(per_call):] + list(per_call)[:round_no % len(per_call)]
        for name in names:
            fallback, call = per_call[name]
            stop = _with_recording(folder(), fallback) if fallback is not None else None
            try:
                for _ in range(block // 10):  # settle: first sightings, the group's declaration
                    call()
                start, cpu = time.perf_counter_ns(), time.thread_time_ns()
                for _ in range(block):
                    call()
                call_us[name].append((time.perf_counter_ns() - start) / block / 1000)
                call_cpu_us[name].append((time.thread_time_ns() - cpu) / block / 1000)
            finally:
                if stop is not None:
                    stop()

    model = DistributedDataParallel(Net())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    hooked = DistributedDataParallel(Net())
    hooked.register_comm_hook(None, default_hooks.allreduce_hook)
    models = {"model": (model, optimizer), "hooked": (hooked, torch.optim.Adam(hooked.parameters(), lr=1e-3))}
    gen = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(64, 1, 28, 28, generator=gen), torch.randint(0, 10, (64,), generator=gen))
               for _ in range(8)]

    def mode_step(m: object, o: object, xb: object, yb: object) -> None:
        o.zero_grad()  # type: ignore[attr-defined]
        loss = F.cross_entropy(m(xb), yb)  # type: ignore[operator]
        with PassThrough():
            loss.backward()
        o.step()  # type: ignore[attr-defined]

    # name -> (recording: with the fallback or not, None for none; the model; the step; the bare kernel)
    step_variants: dict[str, tuple[bool | None, str, Callable, bool]] = {
        FALLBACK_STEPS[0]: (None, "model", train_step, False),
        FALLBACK_STEPS[1]: (None, "model", train_step, True),
        FALLBACK_STEPS[2]: (None, "model", mode_step, False),
        FALLBACK_STEPS[3]: (None, "hooked", train_step, False),
        FALLBACK_STEPS[4]: (False, "model", train_step, False),
        FALLBACK_STEPS[5]: (True, "model", train_step, False),
    }
    # Wall time, and the process's CPU time (all threads: gloo's too, where completion callbacks run).
    step_ms: dict[str, list[float]] = {name: [] for name in step_variants}
    step_cpu_ms: dict[str, list[float]] = {name: [] for name in step_variants}
    for round_no in range(rounds):
        shift = round_no % len(step_variants)  # no variant always first
        names = list(step_variants)[shift:] + list(step_variants)[:shift]
        for name in names:
            fallback, which, step_fn, bare_kernel = step_variants[name]
            m, o = models[which]
            stop = _with_recording(folder(), fallback) if fallback is not None else None
            if bare_kernel:  # installed without a recorder: every call passes through
                dispatch.install(dispatcher_kernel)
                stop = dispatch.uninstall
            try:
                for xb, yb in batches[:3]:
                    step_fn(m, o, xb, yb)
                start, cpu = time.perf_counter_ns(), time.process_time_ns()
                for i in range(steps):
                    xb, yb = batches[i % len(batches)]
                    step_fn(m, o, xb, yb)
                step_ms[name].append((time.perf_counter_ns() - start) / steps / 1e6)
                step_cpu_ms[name].append((time.process_time_ns() - cpu) / steps / 1e6)
            finally:
                if stop is not None:
                    stop()
    # Whether a Python wrapper of ProcessGroup's binding sees DDP's collectives (its C++ calls C++). Last: on
    # torch 2.13 pybind's overloads of the class reject their own options objects once an attribute was replaced,
    # even after it is put back.
    seen = []
    originals = {name: getattr(dist.ProcessGroup, name) for name in ("allreduce", "broadcast", "allgather")}
    for name, original in originals.items():
        def wrapped(self: object, *args: object, _original: Callable = original, _name: str = name,
                    **kwargs: object) -> object:
            seen.append(_name)
            return _original(self, *args, **kwargs)
        setattr(dist.ProcessGroup, name, wrapped)
    try:
        wrapped_model = DistributedDataParallel(Net())
        train_step(wrapped_model, torch.optim.Adam(wrapped_model.parameters(), lr=1e-3), *batches[0])
    finally:
        for name, original in originals.items():
            setattr(dist.ProcessGroup, name, original)

    dist.destroy_process_group()
    (Path(work_dir) / "fallback.json").write_text(json.dumps({"call_us": call_us, "call_cpu_us": call_cpu_us,
                                                              "step_ms": step_ms, "step_cpu_ms": step_cpu_ms,
                                                              "binding_wrap_saw": seen}))


def measure_fallback(rounds: int, block: int, steps: int) -> None:
    """Part e: run ``fallback_rank`` in a fresh process and print its figures, each variant against its baseline
    measured in the same rounds."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="c2p-bench-fallback-") as work_dir:
        mp.spawn(fallback_rank, args=(1, free_port(), rounds, block, steps, work_dir), nprocs=1)
        doc = json.loads((Path(work_dir) / "fallback.json").read_text())
    calls, cpu = doc["call_us"], doc["call_cpu_us"]
    print(f"{'per collective':<44}  {'wall us':>8}  {'over base':>9}  {'thread CPU us':>13}  {'over base':>9}")
    for name in calls:
        base = FALLBACK_CALLS[0] if name in FALLBACK_CALLS[:2] else FALLBACK_CALLS[2]  # bare, or the patch layer alone
        wall, wall0 = statistics.median(calls[name]), statistics.median(calls[base])
        own, own0 = statistics.median(cpu[name]), statistics.median(cpu[base])
        print(f"{name:<44}  {wall:>8.2f}  {wall - wall0:>+9.2f}  {own:>13.2f}  {own - own0:>+9.2f}")
    print(f"{'DDP step (world size 1)':<44}  {'wall ms':>8}  {'vs plain':>9}  {'95 % interval':>19}  "
          f"{'CPU ms':>7}  {'vs plain':>9}")
    for name in doc["step_ms"]:
        cells = []
        for key in ("step_ms", "step_cpu_ms"):
            values, plain = doc[key][name], doc[key]["plain"]
            ratios = [v / p for v, p in zip(values, plain)]
            low, high = ((r - 1) * 100 for r in bootstrap_interval(ratios))
            cells.append((statistics.median(values), (statistics.median(ratios) - 1) * 100, low, high))
        (wall, wall_pct, low, high), (own, own_pct, _low, _high) = cells
        print(f"{name:<44}  {wall:>8.3f}  {wall_pct:>+8.2f}%  {low:>+7.2f} to {high:>+6.2f} %  {own:>7.3f}  "
              f"{own_pct:>+8.2f}%")
    for key, what in (("step_ms", "wall"), ("step_cpu_ms", "CPU")):
        ratios = [f / r for f, r in zip(doc[key][FALLBACK_STEPS[5]], doc[key][FALLBACK_STEPS[4]])]
        low, high = ((r - 1) * 100 for r in bootstrap_interval(ratios))
        print(f"the fallback's own share of a step, {what} time: {(statistics.median(ratios) - 1) * 100:+.2f} % "
              f"(95 % interval {low:+.2f} to {high:+.2f} %; recorded with it against without, paired by round)")
    seen = doc["binding_wrap_saw"]
    print(f"wrapping ProcessGroup.allreduce/broadcast/allgather in Python saw {len(seen)} of DDP's collectives "
          f"(constructor and one step)")


# --- main -------------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=10_000, help="timed all_reduce calls per variant")
    parser.add_argument("--block", type=int, default=1000, help="calls per interleaved block")
    parser.add_argument("--repeats", type=int, default=12, help="DDP runs per variant")
    parser.add_argument("--steps", type=int, default=600, help="DDP steps per run")
    parser.add_argument("--batch", type=int, default=64, help="DDP batch size per rank")
    parser.add_argument("--layers", type=int, default=50, help="Linear layers of the module-tracking model")
    parser.add_argument("--rounds", type=int, default=60, help="block pairs of the in-job DDP measurement")
    parser.add_argument("--only", choices=["patch", "modules", "ddp", "blocks", "fallback"], help="run one part only")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few calls, steps and repeats")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.block, args.repeats, args.steps, args.rounds = 2000, 500, 2, 60, 4
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    completed = True
    print(f"comm2perfetto record benchmark: torch {torch.__version__}, Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs")
    if args.only in (None, "patch"):
        print(f"\n[a] patch layer: all_reduce of a 1-float tensor, gloo, median per call "
              f"({args.calls} calls per variant, blocks of {args.block} interleaved)")
        try:
            report_patch_layer([measure_patch_layer(ws, args.calls, args.block) for ws in (1, 2)])
        except Exception as exc:  # a rank failed: say so and go on to the other part
            print(f"patch layer measurement failed: {type(exc).__name__}: {exc}")
            completed = False
    if args.only in (None, "modules"):
        rounds = 4 if args.quick else 10
        print(f"\n[c] module tracking: nn.Sequential of {args.layers} Linear(8, 8), batch 4, median of "
              f"{rounds} interleaved rounds")
        measure_modules(args.layers, rounds, 20 if args.quick else 200)
    if args.only in (None, "ddp"):
        print(f"\n[b] DDP step time: examples/ddp_train.py, 2 ranks, {args.steps} steps, batch {args.batch}, "
              f"{args.repeats} runs each, alternating")
        completed = measure_ddp(args.repeats, args.steps, args.batch) and completed
    if args.only in (None, "blocks"):
        print(f"\n[d] DDP step time in one process: the same model at world size 1, blocks of 50 steps, recording "
              f"switched on and off between blocks, {args.rounds} rounds")
        measure_ddp_blocks(args.rounds, 50)
    if args.only in (None, "fallback"):
        rounds = 4 if args.quick else 20
        print(f"\n[e] dispatcher fallback: world size 1, gloo, {rounds} rounds of interleaved blocks ({args.block} "
              f"collectives, 30 DDP steps of examples/ddp_train.py each)")
        measure_fallback(rounds, args.block, 30)
    return 0 if completed else 1  # missed targets are figures, not failures


if __name__ == "__main__":
    sys.exit(main())
