"""report against Holistic Trace Analysis (HTA) on synthetic torch.profiler traces of a DDP job on NCCL.

For each size (default 8 and 64 ranks) it writes one Kineto trace per rank (``synthetic_kineto.py``: 20
profiled steps of a 24-block transformer, about 84,000 events and 19 MiB a rank, one straggler rank), then,
each in a fresh process on the same files:

- floor:  read and parse (orjson) every trace in one process, nothing else: the least any reader must do;
- report: ``python -m comm2perfetto.cli report DIR --format json -o report.json``;
- HTA:    ``TraceAnalysis(trace_dir=DIR).get_comm_comp_overlap(visualize=False)``, as HTA's users run it, then
          ``get_temporal_breakdown(visualize=False)`` on the loaded traces, timed apart inside the process.

Printed: wall time (process start to exit; HTA's without the temporal breakdown, which is printed apart) and
peak RSS (the sum over the process and its workers: both tools parse ranks in forked workers, and pages a
worker shares with its parent count in both) of each, the speedup, and the largest per-rank difference in
overlap between report (``ranks[r].overlap_pct``) and HTA (``comp_comm_overlap_pctg``), and between report
and the exact overlap the generator knows (every kernel, to the nanosecond). Targets: report at least 10x
faster than HTA, within 0.5 percentage points of it.

HTA rounds every event inward to whole microseconds (ts up, end down) before it computes anything, so its
overlap is lower than the exact one by about 0.5 points on these traces. The ``rounded`` column is report run
again with ``--hta-rounding``, which reads the traces as HTA does, against HTA (HTA prints two decimals);
``--hta-no-rounding`` instead runs HTA with ``HTA_DISABLE_NS_ROUNDING=1``, which makes it agree with the exact
figures::

    pip install 'comm2perfetto[bench]'             # HolisticTraceAnalysis (pulls pandas, plotly, jupyterlab)
    python benchmarks/bench_report.py                      # 8 and 64 ranks
    python benchmarks/bench_report.py --ranks 8 --steps 5  # quicker
    python benchmarks/bench_report.py --keep /tmp/traces --json figures.json
    python benchmarks/bench_report.py --no-hta             # report alone (no HTA installed)
    python benchmarks/bench_report.py --traces DIR ...     # real traces: HTA's default against the exact

``--traces`` takes folders of real traces (one job each, e.g. the public ones of tests/data/kineto, each copied
into a folder of its own) instead of synthetic ones, and prints per rank HTA's default overlap, report's exact
one and report's ``--hta-scope`` one, and how far HTA's default is from each: the figures docs/report.md
quotes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import synthetic_kineto as synth
from bench_diagnose import compile_package, measure

HTA_INSTALL = ("Holistic Trace Analysis is not installed in this interpreter; install it with\n"
               "    pip install 'comm2perfetto[bench]'      (or: pip install HolisticTraceAnalysis==0.5.0)\n"
               "or run with --no-hta to time report alone.")

_FLOOR = """
import gc, gzip, os, sys
import orjson

gc.disable()
for name in sorted(os.listdir(sys.argv[1])):
    with open(os.path.join(sys.argv[1], name), "rb") as f:
        raw = f.read()
    orjson.loads(gzip.decompress(raw) if raw[:2] == b"\\x1f\\x8b" else raw)
"""

# HTA as its users run it. Its logger writes to stdout too: the figures are the line after a marker.
_HTA = """
import json, sys, time
MARK = "hta-figures: "
from hta.trace_analysis import TraceAnalysis

analysis = TraceAnalysis(trace_dir=sys.argv[1])
overlap = analysis.get_comm_comp_overlap(visualize=False)
figures = {"overlap_pct": dict(zip(overlap["rank"].tolist(), overlap["comp_comm_overlap_pctg"].tolist()))}
if sys.argv[2] == "temporal":
    t0 = time.perf_counter()
    temporal = analysis.get_temporal_breakdown(visualize=False)
    figures["temporal_s"] = time.perf_counter() - t0
    figures["idle_pct"] = dict(zip(temporal["rank"].tolist(), temporal["idle_time_pctg"].tolist()))
print("\\n" + MARK + json.dumps(figures))
"""


def check_reader(stats: synth.JobStats, ranks: list[int]) -> None:
    """Read traces back with comm2perfetto's Kineto reader: every GPU event found and classified as written,
    and the overlap of what it read equal to the generator's (to the nanosecond: same pp to 1e-9)."""
    from comm2perfetto.sources.kineto.reader import read_kineto

    for rank in ranks:
        trace = read_kineto(stats.files[rank])
        if trace.rank != rank or trace.backend != "nccl" or trace.event_count != stats.events[rank]:
            raise SystemExit(f"{stats.files[rank]}: read rank {trace.rank}, backend {trace.backend}, "
                             f"{trace.event_count} events; wrote rank {rank}, {stats.events[rank]} events")
        spans: dict[str, list[tuple[int, int]]] = {synth.COMPUTE: [], synth.COMM: [], synth.MEMORY: []}
        for ev in trace.gpu_events:
            spans[str(ev.klass)].append((ev.t_begin_ns, ev.t_end_ns))
        counts = {k: len(v) for k, v in spans.items()}
        if counts != stats.gpu_counts[rank]:
            raise SystemExit(f"{stats.files[rank]}: read GPU events {counts}, wrote {stats.gpu_counts[rank]}")
        comp, comm = synth.union(spans[synth.COMPUTE]), synth.union(spans[synth.COMM])
        pct = 100.0 * synth.intersection_length(comp, comm) / sum(e - b for b, e in comm)
        if abs(pct - stats.overlap_pct[rank]) > 1e-9:
            raise SystemExit(f"{stats.files[rank]}: overlap of what was read {pct}, "
                             f"written {stats.overlap_pct[rank]}")
        if not trace.steps or not trace.gpu_annotations:
            raise SystemExit(f"{stats.files[rank]}: no ProfilerStep or gpu_user_annotation read")


def run_report(folder: Path, out: Path, env: dict[str, str], *options: str) -> dict[str, Any]:
    wall, mib, status, text, cpu = measure([sys.executable, "-m", "comm2perfetto.cli", "report", str(folder),
                                            "--format", "json", "-o", str(out), *options], env)
    if status != 0:
        raise SystemExit(f"report exited {status}:\n{text[-3000:]}")
    doc = json.loads(out.read_text())
    overlap = {int(r): v["overlap_pct"] for r, v in doc["ranks"].items()}
    return {"s": wall, "mib": mib, "cpu_s": cpu, "overlap_pct": overlap, "basis": doc.get("basis")}


def run_hta(folder: Path, env: dict[str, str], temporal: bool) -> dict[str, Any]:
    wall, mib, status, text, cpu = measure([sys.executable, "-c", _HTA, str(folder),
                                            "temporal" if temporal else "-"], env, merge_stderr=True)
    if status != 0:
        raise SystemExit(f"HTA exited {status}:\n{text[-3000:]}")
    figures = json.loads(text.rsplit("hta-figures: ", 1)[-1].splitlines()[0])
    temporal_s = figures.get("temporal_s", 0.0)
    return {"s": wall - temporal_s, "temporal_s": temporal_s if temporal else None, "mib": mib, "cpu_s": cpu,
            "overlap_pct": {int(r): v for r, v in figures["overlap_pct"].items()}}


def compare_real(folders: list[Path], env: dict[str, str]) -> None:
    """HTA's default overlap against report's exact and --hta-scope figures on real traces, per rank."""
    print(f"{'traces':<40} {'rank':>4} {'HTA %':>7} {'exact %':>8} {'scope %':>8} {'|HTA-exact| pp':>14} "
          f"{'|HTA-scope| pp':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        for folder in folders:
            hta = run_hta(folder, env, temporal=False)["overlap_pct"]
            exact = run_report(folder, out, env)["overlap_pct"]
            scope = run_report(folder, out, env, "--hta-scope")["overlap_pct"]
            for rank in sorted(hta):
                h, e, s = hta[rank], exact.get(rank), scope.get(rank)
                print(f"{folder.name:<40} {rank:>4} {h:>7.2f} {_pct(e):>8} {_pct(s):>8} "
                      f"{_pct(abs(h - e) if e is not None else None):>14} "
                      f"{_pct(abs(h - s) if s is not None else None):>14}", flush=True)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def max_diff(a: dict[int, float | None], b: dict[int, float | None]) -> float:
    """The largest per-rank |a - b|; infinite when a rank is missing or unknown on either side."""
    if set(a) != set(b):
        return float("inf")
    return max((abs(a[r] - b[r]) if a[r] is not None and b[r] is not None else float("inf")) for r in a)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[8, 64])
    p.add_argument("--steps", type=int, default=20, help="profiled steps a rank (default 20)")
    p.add_argument("--layers", type=int, default=24, help="transformer blocks: kernels a step (default 24)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gzip", action="store_true", help="write .pt.trace.json.gz (default: plain .json)")
    p.add_argument("--repeat", type=int, default=1, help="runs of report; the fastest is kept (HTA runs once)")
    p.add_argument("--no-hta", action="store_true", help="time report alone")
    p.add_argument("--no-temporal", action="store_true", help="skip HTA's get_temporal_breakdown")
    p.add_argument("--hta-no-rounding", action="store_true",
                   help="run HTA with HTA_DISABLE_NS_ROUNDING=1 (nanosecond times, as report uses)")
    p.add_argument("--check", action="store_true",
                   help="read every trace back with comm2perfetto's reader (default: the first rank only)")
    p.add_argument("--keep", type=Path, default=None, metavar="DIR",
                   help="write the traces and report's output under DIR and keep them (default: a temp dir)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    p.add_argument("--traces", type=Path, nargs="+", metavar="DIR",
                   help="compare HTA's default with report's exact and --hta-scope overlap on these folders of "
                        "real traces (one job each) instead of timing synthetic ones")
    args = p.parse_args(argv)
    compile_package()
    if not args.no_hta and importlib.util.find_spec("hta") is None:
        raise SystemExit(HTA_INSTALL)
    if args.traces:
        compare_real(args.traces, dict(os.environ, OMP_NUM_THREADS="1"))
        return 0
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-report-"))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    hta_env = dict(env, HTA_DISABLE_NS_ROUNDING="1") if args.hta_no_rounding else env
    rows = []
    print(f"{'ranks':>6} {'events/rank':>11} {'floor s':>7} {'HTA s':>7} {'+temporal':>9} {'report s':>8} "
          f"{'speedup':>7} {'rep/floor':>9} "
          f"{'HTA MiB':>7} {'report MiB':>10} {'|rep-HTA| pp':>12} {'rounded':>7} {'|rep-exact| pp':>14} "
          f"{'overlap %':>13} {'CPU s rep/HTA':>13} {'load':>5}")
    for world in args.ranks:
        folder = root / f"ranks{world}"
        shutil.rmtree(folder, ignore_errors=True)
        stats = synth.write_job(folder, world, args.steps, args.layers, seed=args.seed, compress=args.gzip)
        check_reader(stats, list(range(world)) if args.check else [0])
        floor = measure([sys.executable, "-c", _FLOOR, str(folder)], env)
        if floor[2] != 0:
            raise SystemExit(f"the floor exited {floor[2]}:\n{floor[3][-3000:]}")
        out = root / f"report{world}.json"
        rep = min((run_report(folder, out, env) for _ in range(args.repeat)), key=lambda m: m["s"])
        if rep["basis"] != "gpu":
            raise SystemExit(f"report's basis is {rep['basis']!r}, not 'gpu': it did not use the GPU kernels")
        events = sum(stats.events.values()) // world
        exact = dict(stats.overlap_pct)
        row: dict[str, Any] = {
            "ranks": world, "steps": args.steps, "events_per_rank": events, "trace_mib": stats.bytes / 2**20,
            "floor_s": floor[0], "floor_mib": floor[1],
            "report_s": rep["s"], "report_mib": rep["mib"], "report_cpu_s": rep["cpu_s"],
            "max_diff_report_exact_pp": max_diff(rep["overlap_pct"], exact),
            "overlap_pct_exact": {str(r): v for r, v in exact.items()}, "straggler": stats.straggler,
            "load_average": os.getloadavg()[0],
        }
        hta_s = temporal = hta_mib = diff_hta = diff_rounded = hta_cpu = None
        if not args.no_hta:
            hta = run_hta(folder, hta_env, temporal=not args.no_temporal)
            hta_s, temporal, hta_mib, hta_cpu = hta["s"], hta["temporal_s"], hta["mib"], hta["cpu_s"]
            diff_hta = max_diff(rep["overlap_pct"], hta["overlap_pct"])
            if not args.hta_no_rounding:  # report as HTA reads the traces: the same figures, to the digit
                rounded = run_report(folder, out, env, "--hta-rounding")
                diff_rounded = max_diff(rounded["overlap_pct"], hta["overlap_pct"])
                row.update(max_diff_report_hta_rounding_hta_pp=diff_rounded,
                           overlap_pct_report_hta_rounding={str(r): v for r, v in rounded["overlap_pct"].items()})
            row.update(hta_s=hta_s, hta_temporal_s=temporal, hta_mib=hta_mib, hta_cpu_s=hta_cpu,
                       hta_no_rounding=args.hta_no_rounding, speedup=hta_s / rep["s"],
                       max_diff_report_hta_pp=diff_hta, max_diff_hta_exact_pp=max_diff(hta["overlap_pct"], exact),
                       overlap_pct_hta={str(r): v for r, v in hta["overlap_pct"].items()})
        row["overlap_pct_report"] = {str(r): v for r, v in rep["overlap_pct"].items()}
        rows.append(row)

        def fmt(value: float | None, spec: str, suffix: str = "") -> str:
            return "-" if value is None else f"{value:{spec}}{suffix}"

        span = f"{min(exact.values()):.1f}-{max(exact.values()):.1f}"
        cpu = f"{rep['cpu_s']:.1f}/{fmt(hta_cpu, '.1f')}"
        print(f"{world:>6} {events:>11,} {floor[0]:>7.2f} {fmt(hta_s, '.2f'):>7} {fmt(temporal, '.2f'):>9} "
              f"{rep['s']:>8.2f} {fmt(hta_s / rep['s'] if hta_s else None, '.1f', 'x'):>7} "
              f"{rep['s'] / floor[0]:>8.2f}x {fmt(hta_mib, 'd'):>7} "
              f"{rep['mib']:>10} {fmt(diff_hta, '.2f'):>12} {fmt(diff_rounded, '.2f'):>7} "
              f"{row['max_diff_report_exact_pp']:>14.4f} "
              f"{span:>13} {cpu:>13} {row['load_average']:>5.1f}", flush=True)
        if args.keep is None:
            shutil.rmtree(folder)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
