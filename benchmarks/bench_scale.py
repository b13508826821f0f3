"""Production scale: diagnose, merge and report on big synthetic jobs, against the parallel floor and torchfrtrace.

The dumps are written once, outside the timing, by ``generate`` (the same NCCL 2.10 dumps as
``bench_diagnose.py``: three call sites a rank, frames shared inside a dump, one planted hang where the last rank
never issued the last all-reduce), then ``run`` measures each command in a fresh process on them, with in the
same run:

- floor: every dump unpickled in a pool of as many processes as the machine has cores, gc off, nothing kept
  (the least any reader must do with these cores);
- torchfrtrace (``--torchfrtrace``): ``python -m torch.distributed.flight_recorder.fr_trace DIR``.

Cases (``--case``, several allowed) and their targets (issue 23):

- ``16384x2000``: diagnose names the planted rank, peak at most 3 GB, wall at most 1.5x the floor;
- ``256x20000``:  diagnose peak at most 600 MB, merge peak at most 1 GB;
- ``2048x2000``:  diagnose at least 20x faster than torchfrtrace, ``report --format json`` at most 2x diagnose;
- ``4x2000``:     the small end (start-up included): compare with the previous version in the same session.

::

    python benchmarks/bench_scale.py generate --data /work/scale-data --case 16384x2000 256x20000 2048x2000
    python benchmarks/bench_scale.py run --data /work/scale-data --case 2048x2000 --torchfrtrace
    python benchmarks/bench_scale.py run --data /work/scale-data --case 256x20000 --commands diagnose merge

Peak memory is the largest resident set of the process and its children together (workers included). Every dump
is read once before the floor, untimed, so that every timed reader finds them in the page cache.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
from pathlib import Path

from bench_diagnose import compile_package, measure, write_dumps

_FLOOR = """
import gc, os, pickle, sys
from multiprocessing import Pool

def load(path):
    gc.disable()
    with open(path, "rb") as f:
        pickle.load(f)
    return 0

if __name__ == "__main__":
    d, n = sys.argv[1], int(sys.argv[2])
    paths = [os.path.join(d, name) for name in sorted(os.listdir(d)) if not name.startswith(".")]
    with Pool(n) as pool:
        for _ in pool.imap_unordered(load, paths, chunksize=16):
            pass
"""

TARGETS = {
    "16384x2000": "diagnose: planted rank named, peak <= 3072 MiB, wall <= 1.5x floor",
    "256x20000": "diagnose peak <= 600 MiB; merge peak <= 1024 MiB",
    "2048x2000": "diagnose >= 20x faster than torchfrtrace; report --format json <= 2x diagnose",
    "4x2000": "no slower than the previous version (start-up included)",
}


def _case(text: str) -> tuple[int, int]:
    world, _, entries = text.partition("x")
    return int(world), int(entries)


def _generate_part(task: tuple[str, int, int, int, int]) -> int:
    folder, world, entries, lo, hi = task
    write_dumps(Path(folder), world, entries, range(lo, hi))
    return hi - lo


def generate(data: Path, case: str, jobs: int) -> Path:
    """Write the case's dumps once (a ``.complete`` marker says they are all there)."""
    world, entries = _case(case)
    folder = data / f"ranks{case}"
    if (folder / ".complete").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    step = max(1, world // (jobs * 16))
    tasks = [(str(folder), world, entries, lo, min(world, lo + step)) for lo in range(0, world, step)]
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        done = 0
        for n in pool.imap_unordered(_generate_part, tasks):
            done += n
            print(f"\r{case}: {done}/{world} dumps", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    (folder / ".complete").write_text("")
    return folder


def _warm(folder: Path) -> None:
    """Read every dump once, untimed, so that the floor and the commands after it all read from the page cache
    (a cold first reader pays for the disk: 23 s for the 16,384-rank floor where a warm one takes 18 s)."""
    for path in folder.iterdir():
        with path.open("rb") as f:
            while f.read(1 << 20):
                pass


def _run_cli(args: list[str], env: dict[str, str]) -> tuple[float, int, int, str, float]:
    return measure([sys.executable, "-m", "comm2perfetto.cli", *args], env)


def run_case(data: Path, case: str, commands: list[str], torchfrtrace: bool, jobs: int, out_dir: Path) -> dict:
    world, entries = _case(case)
    folder = data / f"ranks{case}"
    if not (folder / ".complete").exists():
        raise SystemExit(f"{folder}: no dumps; run `bench_scale.py generate --case {case}` first")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    row: dict = {"case": case, "ranks": world, "entries_per_rank": entries, "jobs": jobs,
                 "target": TARGETS.get(case, "")}
    _warm(folder)
    floor = measure([sys.executable, "-c", _FLOOR, str(folder), str(jobs)], env)
    row.update(floor_s=floor[0], floor_mib=floor[1], floor_cpu_s=floor[4])
    print(f"{case}: floor {floor[0]:.1f} s, {floor[1]} MiB", flush=True)
    culprit = world - 1
    if "diagnose" in commands:
        wall, mib, status, text, cpu = _run_cli(["diagnose", str(folder), "--format", "json", "--jobs", str(jobs)],
                                                env)
        finding = json.loads(text)["findings"][0] if status == 1 else {}
        ok = finding.get("kind") == "missing_ranks" and finding.get("culprit_ranks") == [culprit]
        row.update(diagnose_s=wall, diagnose_mib=mib, diagnose_cpu_s=cpu, diagnose_right=ok)
        print(f"{case}: diagnose {wall:.1f} s ({wall / floor[0]:.2f}x floor), {mib} MiB, verdict "
              f"{'right' if ok else 'WRONG: ' + text[-500:]}", flush=True)
    if "report" in commands:
        wall, mib, status, text, cpu = _run_cli(["report", str(folder), "--format", "json", "--jobs", str(jobs)],
                                                env)
        if status != 0:
            raise SystemExit(f"report exited {status}:\n{text[-2000:]}")
        row.update(report_s=wall, report_mib=mib, report_cpu_s=cpu)
        ratio = f" ({wall / row['diagnose_s']:.2f}x diagnose)" if "diagnose_s" in row else ""
        print(f"{case}: report --format json {wall:.1f} s{ratio}, {mib} MiB", flush=True)
    if "merge" in commands:
        trace = out_dir / f"job{case}.pftrace"
        wall, mib, status, text, cpu = _run_cli(["merge", str(folder), "-o", str(trace), "--jobs", str(jobs)], env)
        if status != 0:
            raise SystemExit(f"merge exited {status}:\n{text[-2000:]}")
        row.update(merge_s=wall, merge_mib=mib, merge_cpu_s=cpu, merge_bytes=trace.stat().st_size)
        print(f"{case}: merge {wall:.1f} s, {mib} MiB, {trace.stat().st_size / 2**20:.1f} MiB trace", flush=True)
        trace.unlink()
    if torchfrtrace:
        wall, mib, status, text, cpu = measure([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                                                str(folder)], env, merge_stderr=True)
        ok = f"missing ranks: {{{culprit}}}" in text
        row.update(torchfrtrace_s=wall, torchfrtrace_mib=mib, torchfrtrace_cpu_s=cpu, torchfrtrace_right=ok)
        speed = f" (diagnose {wall / row['diagnose_s']:.1f}x faster)" if "diagnose_s" in row else ""
        print(f"{case}: torchfrtrace {wall:.1f} s, {mib} MiB{speed}", flush=True)
    row["load_average"] = os.getloadavg()[0]
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("action", choices=("generate", "run"))
    p.add_argument("--data", type=Path, required=True, help="where the dumps are (written once by generate)")
    p.add_argument("--case", nargs="+", default=["2048x2000"], help="RANKSxENTRIES, e.g. 16384x2000 256x20000")
    p.add_argument("--commands", nargs="+", default=["diagnose", "report", "merge"],
                   choices=("diagnose", "report", "merge"))
    p.add_argument("--torchfrtrace", action="store_true", help="also time torchfrtrace (it needs torch)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: every core)")
    p.add_argument("--json", type=Path, help="append the figures to this file (one JSON object a line)")
    args = p.parse_args(argv)
    if args.action == "generate":
        for case in args.case:
            generate(args.data, case, args.jobs)
        return 0
    compile_package()
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        for case in args.case:
            row = run_case(args.data, case, args.commands, args.torchfrtrace, args.jobs, Path(tmp))
            print(json.dumps(row), flush=True)
            if args.json:
                with args.json.open("a") as f:
                    f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
