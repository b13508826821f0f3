"""The small end: diagnose, merge and report at 2-4 ranks, start-up included, against another version's source.

Each command runs in a fresh process (interpreter start, imports, reading, output) on the 4-rank recording in
tests/data/recording/subgroups and on synthetic 4-rank NCCL dumps of 2,000 entries (``bench_diagnose``'s),
alternating this tree and the baseline (``--baseline SRC``: the ``src`` folder of another checkout, e.g.
``git worktree add /tmp/base main``), both byte-compiled first; the fastest of ``--rounds`` runs is kept, as
noise on a shared machine only ever adds time::

    python benchmarks/bench_small.py --baseline /tmp/base/src --rounds 15
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_diagnose import write_dumps

HERE = Path(__file__).resolve().parents[1]
RECORDING = HERE / "tests" / "data" / "recording" / "subgroups"


def _once(src: Path, argv: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one run; CPU (user + system, workers included) does not depend on what else the
    machine runs, wall does."""
    env = dict(os.environ, PYTHONPATH=str(src))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "comm2perfetto.cli", *argv], env=env, capture_output=True)
    took = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{src}: {' '.join(argv)} exited {proc.returncode}:\n{proc.stderr.decode()[-2000:]}")
    return took, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline", type=Path, required=True, help="the src folder of the version to compare with")
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args(argv)
    current = HERE / "src"
    for src in (current, args.baseline):
        compileall.compile_dir(src / "comm2perfetto", quiet=1)
    with tempfile.TemporaryDirectory(prefix="bench-small-") as tmp:
        dumps = Path(tmp) / "dumps"
        write_dumps(dumps, 4, 2000)
        cases = []
        for name, folder in (("recording", RECORDING), ("4x2000", dumps)):
            cases += [(f"diagnose {name}", ["diagnose", str(folder)]),
                      (f"report {name}", ["report", str(folder), "--format", "json"]),
                      (f"merge {name}", ["merge", str(folder), "-o", str(Path(tmp) / "x.pftrace")])]
        print(f"{'case':<22} {'baseline s':>10} {'this s':>8} {'ratio':>6} {'CPU baseline':>12} {'CPU this':>9} "
              f"{'ratio':>6}")
        for label, cmd in cases:
            wall = {current: float("inf"), args.baseline: float("inf")}
            cpu = dict(wall)
            for _ in range(args.rounds):
                for src in (args.baseline, current):
                    w, c = _once(src, cmd)
                    wall[src], cpu[src] = min(wall[src], w), min(cpu[src], c)
            base, this = args.baseline, current
            print(f"{label:<22} {wall[base]:>10.3f} {wall[this]:>8.3f} {wall[this] / wall[base]:>6.2f} "
                  f"{cpu[base]:>12.3f} {cpu[this]:>9.3f} {cpu[this] / cpu[base]:>6.2f}", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
