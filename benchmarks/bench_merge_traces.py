"""merge of torch.profiler traces alone (no Flight Recorder, no recorder) against the floor and against HTA.

For each size (default 8 and 64 ranks) it writes one synthetic Kineto trace per rank (``synthetic_kineto.py``:
a DDP job on NCCL, one straggler, every node's clock off by 137 us), then, each in a fresh process on the same
files:

- floor: read and parse (orjson) every trace in one process, nothing else: the least any reader must do;
- merge: ``python -m comm2perfetto.cli merge DIR -o job.pftrace``: ranks, collectives matched across ranks,
         clocks aligned on the NCCL kernels' ends, every CPU op and GPU kernel written to one Perfetto trace,
         with their args, ids and launch-to-kernel flows;
- lean:  the same with ``--lean`` (profiler events without args, ids and flows, as merge wrote them before it
         kept Kineto's detail): the baseline of the bytes per slice the detail costs;
- HTA:   ``TraceAnalysis(trace_dir=DIR)``: Holistic Trace Analysis loading the same traces (what every HTA
         analysis starts with; it aligns nothing and writes nothing).

Printed: wall time and CPU time (the process and its workers; on a shared machine compare those) and peak RSS
of each, the ratios, the merge's output size, and how far the clock offsets merge found are from the
generator's (node k's clock runs k x ``NODE_CLOCK_SKEW_NS`` ahead, 8 ranks a node); then, per size, bytes per
slice and flows of merge and of merge --lean, and their ratio::

    pip install 'comm2perfetto[bench]'              # HolisticTraceAnalysis
    python benchmarks/bench_merge_traces.py                     # 8 and 64 ranks, 5 steps
    python benchmarks/bench_merge_traces.py --ranks 8 --no-hta
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import synthetic_kineto as synth
from bench_diagnose import compile_package, measure
from bench_report import _FLOOR

_HTA_LOAD = """
import sys
from hta.trace_analysis import TraceAnalysis
TraceAnalysis(trace_dir=sys.argv[1])
"""

_OFFSETS = """
import sys
from comm2perfetto.match import load_job
job = load_job([sys.argv[1]])
print(repr((dict(job.clock.offset_ns), job.clock.residual_skew_ns)))
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[8, 64])
    p.add_argument("--steps", type=int, default=5, help="profiled steps a rank (default 5)")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--no-hta", action="store_true", help="leave HTA out")
    p.add_argument("--keep", type=Path, help="write the traces here and keep them")
    args = p.parse_args(argv)
    if not args.no_hta and importlib.util.find_spec("hta") is None:
        raise SystemExit("HTA is not installed: pip install 'comm2perfetto[bench]', or run with --no-hta")
    compile_package()
    env = dict(os.environ)
    root = args.keep or Path(tempfile.mkdtemp(prefix="c2p-bench-traces-"))
    print(f"{'ranks':>5} {'MiB':>5} {'floor':>12} {'merge':>12} {'HTA load':>13} {'merge/floor':>11} "
          f"{'HTA/merge':>9} {'merge MiB':>9} {'HTA MiB':>8} {'output':>8}  clock offsets vs true (wall, CPU s)")
    try:
        for world in args.ranks:
            folder = root / f"r{world}"
            stats = synth.write_job(folder, world, steps=args.steps, layers=args.layers)
            floor_s, _, _, _, floor_cpu = measure([sys.executable, "-c", _FLOOR, str(folder)], env)
            out = root / f"r{world}.pftrace"
            merge_s, merge_mib, status, text, merge_cpu = measure(
                [sys.executable, "-m", "comm2perfetto.cli", "merge", str(folder), "-o", str(out)], env)
            if status != 0:
                raise SystemExit(f"merge exited {status}:\n{text[-2000:]}")
            lean_out = root / f"r{world}.lean.pftrace"
            lean_s, lean_mib, status, lean_text, lean_cpu = measure(
                [sys.executable, "-m", "comm2perfetto.cli", "merge", str(folder), "-o", str(lean_out), "--lean"], env)
            if status != 0:
                raise SystemExit(f"merge --lean exited {status}:\n{lean_text[-2000:]}")
            detail = _detail_line(world, text, out, merge_s, merge_cpu, merge_mib, lean_text, lean_out, lean_s,
                                  lean_cpu, lean_mib)
            hta = "-"
            hta_s = hta_mib = hta_cpu = None
            if not args.no_hta:
                hta_s, hta_mib, status, text, hta_cpu = measure([sys.executable, "-c", _HTA_LOAD, str(folder)],
                                                                env, merge_stderr=True)
                if status != 0:
                    raise SystemExit(f"HTA exited {status}:\n{text[-2000:]}")
                hta = f"{hta_s:.1f}/{hta_cpu:.1f}"
            _, _, _, text, _ = measure([sys.executable, "-c", _OFFSETS, str(folder)], env)
            offsets, residual = eval(text.strip().splitlines()[-1])  # our own repr of ints
            # t_rank0 = t_local + offset, and rank r's clock runs (r // 8) * skew ahead of rank 0's
            errors = [abs(off + (r // synth.GPUS_PER_NODE) * synth.NODE_CLOCK_SKEW_NS) for r, off in offsets.items()]
            found = f"max error {max(errors) / 1000:.1f} us, residual {(residual or 0) / 1000:.1f} us"
            size_mib = stats.bytes / 2**20
            print(f"{world:>5} {size_mib:>5.0f} {floor_s:>5.1f}/{floor_cpu:>5.1f} {merge_s:>5.1f}/{merge_cpu:>5.1f} "
                  f"{hta:>13} {merge_cpu / floor_cpu:>10.2f}x "
                  f"{(f'{hta_cpu / merge_cpu:.2f}x' if hta_cpu else '-'):>9} "
                  f"{merge_mib:>9.0f} {(f'{hta_mib:.0f}' if hta_mib else '-'):>8} "
                  f"{out.stat().st_size / 2**20:>6.1f}Mi  {found}")
            print(detail)
            sys.stdout.flush()
            if not args.keep:
                shutil.rmtree(folder)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


_WROTE = re.compile(r"wrote .*?; ([\d,]+) slices, [\d,]+ instants, ([\d,]+) flows")


def _detail_line(world: int, text: str, out: Path, merge_s: float, merge_cpu: float, merge_mib: float,
                 lean_text: str, lean_out: Path, lean_s: float, lean_cpu: float, lean_mib: float) -> str:
    """What keeping Kineto's args, ids and launch flows costs: merge against merge --lean, same files."""
    counts = [_WROTE.search(t) for t in (text, lean_text)]
    if not all(counts):
        return f"{world:>5} (no summary line to read slices from)"
    (slices, flows), (lean_slices, lean_flows) = [(int(m.group(1).replace(",", "")), int(m.group(2).replace(
        ",", ""))) for m in counts if m is not None]
    per, lean_per = out.stat().st_size / slices, lean_out.stat().st_size / lean_slices
    return (f"{world:>5}  bytes per slice: merge {per:.1f} ({flows:,} flows), --lean {lean_per:.1f} "
            f"({lean_flows:,} flows): {per / lean_per:.2f}x; wall/CPU s {merge_s:.1f}/{merge_cpu:.1f} against "
            f"{lean_s:.1f}/{lean_cpu:.1f}; peak {merge_mib:.0f} against {lean_mib:.0f} MiB")


if __name__ == "__main__":
    sys.exit(main())
