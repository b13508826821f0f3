"""merge against the unpickle floor, on synthetic NCCL Flight Recorder dumps (the ones bench_diagnose writes).

For each size (default 64, 256 and 1024 ranks, 2000 entries a rank, one planted hang), each in a fresh
process on the same files:

- floor:            read and unpickle every dump, nothing else;
- merge:            ``comm2perfetto merge DIR -o job.pftrace`` as a user runs it (above 256 ranks: the ranks
                    findings name plus a sample, 256 in all);
- merge --all-ranks: every rank written (1024 ranks x 2000 collectives = 2M slices).

Printed: wall time, peak RSS (the process and its workers), output size, slices written and bytes per slice,
and the ratios the targets are stated in (merge within 4x of the floor, at most 2 GB, at most 40 bytes per
slice)::

    python benchmarks/bench_merge.py                   # 64, 256, 1024 ranks
    python benchmarks/bench_merge.py --ranks 64 --check   # also decode the trace and check the TrackEvent rules
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from bench_diagnose import _FLOOR, compile_package, measure, write_dumps


def _merge(folder: Path, out: Path, env: dict[str, str], *extra: str) -> dict:
    wall, mib, status, text, cpu = measure([sys.executable, "-m", "comm2perfetto.cli", "merge", str(folder),
                                            "-o", str(out), *extra], env)
    if status != 0:
        raise SystemExit(f"merge exited {status}:\n{text[-3000:]}")
    m = re.search(r"([\d,]+) slices", text)
    slices = int(m.group(1).replace(",", "")) if m else 0
    size = out.stat().st_size
    return {"s": wall, "mib": mib, "cpu_s": cpu, "bytes": size, "slices": slices,
            "bytes_per_slice": size / max(slices, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--entries", type=int, default=2000, help="entries per rank (default 2000)")
    p.add_argument("--repeat", type=int, default=1, help="runs of each; the fastest is kept")
    p.add_argument("--check", action="store_true", help="decode each trace and check the TrackEvent rules")
    p.add_argument("--dir", type=Path, default=None, help="where to write the dumps (default: a temp dir)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    compile_package()
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-merge-"))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    rows = []
    print(f"{'ranks':>6} {'mode':>10} {'floor s':>8} {'merge s':>8} {'vs floor':>8} {'peak MiB':>8} "
          f"{'slices':>10} {'out MiB':>8} {'B/slice':>8} {'CPU s':>7}")
    for world in args.ranks:
        folder = root / f"ranks{world}"
        shutil.rmtree(folder, ignore_errors=True)
        write_dumps(folder, world, args.entries)
        floor = min((measure([sys.executable, "-c", _FLOOR, str(folder)], env) for _ in range(args.repeat)),
                    key=lambda m: m[0])
        modes = [("default", ())] + ([("all-ranks", ("--all-ranks",))] if world > 256 else [])
        for mode, extra in modes:
            out = root / f"job{world}-{mode}.pftrace"
            r = min((_merge(folder, out, env, *extra) for _ in range(args.repeat)), key=lambda m: m["s"])
            if args.check:
                from comm2perfetto.trace.check import check_trace

                check_trace(out)
            row = {"ranks": world, "mode": mode, "entries_per_rank": args.entries, "floor_s": floor[0],
                   "floor_mib": floor[1], **{f"merge_{k}": v for k, v in r.items()}}
            rows.append(row)
            print(f"{world:>6} {mode:>10} {floor[0]:>8.2f} {r['s']:>8.2f} {r['s'] / floor[0]:>7.2f}x "
                  f"{r['mib']:>8} {r['slices']:>10,} {r['bytes'] / 2**20:>8.1f} {r['bytes_per_slice']:>8.1f} "
                  f"{r['cpu_s']:>7.2f}", flush=True)
            out.unlink()
        shutil.rmtree(folder)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
