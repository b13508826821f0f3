"""diagnose against torchfrtrace and the unpickle floor, on synthetic NCCL Flight Recorder dumps.

For each size (default 64, 256 and 1024 ranks) it writes one dump per rank in FR format 2.10, torch's file
naming (``nccl_trace_rank_<r>``), 2000 entries a rank (the default ring buffer), with one planted hang: the
last rank never issued the last all-reduce, which every other rank has started. Then, each in a fresh
process, on the same files:

- floor:       read and unpickle every dump, nothing else (the least any reader of these dumps must do);
- diagnose:    ``comm2perfetto diagnose DIR --format json`` (checked: names the planted rank);
- torchfrtrace: ``python -m torch.distributed.flight_recorder.fr_trace DIR`` (checked: names it too).

Wall time (process start to exit) and peak RSS (``ru_maxrss`` of that process) are printed side by side with
the ratios the targets are stated in::

    python benchmarks/bench_diagnose.py                  # 64, 256, 1024 ranks
    python benchmarks/bench_diagnose.py --ranks 64 256   # quicker
    python benchmarks/bench_diagnose.py --no-torchfrtrace --ranks 1024

The dumps' frame dicts are shared between entries, as torch's C++ pickler writes them (it memoizes the
frame dicts of one dump by pointer); every entry has its own frames list.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

T0_NS = 1_795_313_447_000_000_000
STEP_NS = 2_000_000

_FLOOR = """
import pickle, sys, os
d = sys.argv[1]
for name in sorted(os.listdir(d)):
    with open(os.path.join(d, name), "rb") as f:
        pickle.load(f)
"""


def _frames() -> list[list[dict]]:
    torch_frames = [
        {"name": "all_reduce", "filename": "/opt/venv/lib/python3.11/site-packages/torch/distributed/"
                                          "distributed_c10d.py", "line": 3245},
        {"name": "wrapper", "filename": "/opt/venv/lib/python3.11/site-packages/torch/distributed/"
                                       "c10d_logger.py", "line": 83},
    ]
    user = [{"name": n, "filename": f"/home/user/proj/{f}", "line": ln}
            for n, f, ln in (("step", "train.py", 120), ("train", "train.py", 200), ("main", "train.py", 260),
                             ("<module>", "train.py", 270))]
    sites = []
    for i in range(4):  # four call sites, one per op below
        site = [dict(user[0], line=100 + i)] + user[1:]
        sites.append(torch_frames + site)
    return sites


OPS = (("nccl:all_reduce", [[25_000_000]], None), ("nccl:_all_gather_base", [[1_048_576]], "gather"),
       ("nccl:_reduce_scatter_base", [[4_194_304]], "scatter"), ("nccl:broadcast", [[1024, 1024]], None))


def write_dumps(folder: Path, world: int, entries: int, ranks: range | None = None) -> int:
    """One 2.10 dump per rank (of ``ranks``, default all); returns the planted culprit rank."""
    folder.mkdir(parents=True, exist_ok=True)
    culprit = world - 1
    frames = _frames()
    pg_config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}}
    for rank in ranks if ranks is not None else range(world):
        shared = [[dict(f) for f in site] for site in frames]  # this dump's own frame dicts, shared inside it
        n = entries - 1 if rank == culprit else entries
        out = []
        for i in range(n):
            name, ins, kind = OPS[i % len(OPS)]
            outs = ([[ins[0][0] * world]] if kind == "gather" else
                    [[ins[0][0] // world]] if kind == "scatter" else ins)
            created = T0_NS + i * STEP_NS + (rank * 7919) % 100_000
            last = i == entries - 1
            state = "started" if last else "completed"
            out.append({
                "frames": list(shared[i % len(OPS)]), "record_id": i, "pg_id": 0,
                "process_group": ("0", "default_pg"), "collective_seq_id": i + 1, "p2p_seq_id": 0, "op_id": i + 1,
                "profiling_name": name, "time_created_ns": created, "duration_ms": None if last else 1.25,
                "input_sizes": ins, "input_dtypes": ["BFloat16"], "output_sizes": outs,
                "output_dtypes": ["BFloat16"], "state": state,
                "time_discovered_started_ns": created + 20_000,
                "time_discovered_completed_ns": None if last else created + 1_500_000,
                "retired": not last, "timeout_ms": 600_000, "is_p2p": False,
                "thread_name": "pt_main_thread", "thread_id": "140151234567890",
            })
            if out[-1]["duration_ms"] is None:
                del out[-1]["duration_ms"]
        last_done = n - 1 if rank != culprit else n
        doc = {"version": "2.10", "comm_lib_version": "2.21.5", "pg_config": pg_config,
               "pg_status": {"0": {"last_enqueued_collective": n, "last_started_collective": n,
                                   "last_completed_collective": last_done}},
               "entries": out}
        (folder / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(doc, protocol=2))
    return culprit


def compile_package() -> None:
    """Byte-compile comm2perfetto as ``pip install`` does for an installed package, and as the tools it is
    compared with (torch, HTA) are in site-packages. An editable checkout under PYTHONDONTWRITEBYTECODE (this
    build machine sets it) would otherwise compile every module from source at each start: 50 ms for report.
    A source changed later is compiled again in memory, never read stale."""
    import compileall

    import comm2perfetto

    compileall.compile_dir(os.path.dirname(comm2perfetto.__file__), quiet=1)


def _tree_rss_kib(pid: int) -> int:
    """Resident memory of a process and all its descendants (Linux /proc), in KiB; 0 once it is gone."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return total


def measure(cmd: list[str], env: dict[str, str] | None = None,
            merge_stderr: bool = False) -> tuple[float, int, int, str, float]:
    """(wall seconds, peak RSS in MiB, exit status, output, CPU seconds) of one fresh process. The output is
    stdout; stderr is appended with ``merge_stderr`` (torchfrtrace reports there) or when the process failed
    (exit status other than 0 or 1).

    CPU seconds (user + system, the process and the children it waited for) do not depend on what else the
    machine is running, unlike wall time: on a shared machine compare those.

    Peak RSS is the largest sum over the process and its children (diagnose reads dumps in worker processes
    on big jobs), sampled every 5 ms, and never less than the kernel's ru_maxrss of the process itself.
    """
    import threading

    t0 = time.perf_counter()
    # stderr apart (diagnose reports progress there), kept in a file so neither pipe can fill and block.
    err_file = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err_file, env=env)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss_kib(proc.pid))
            done.wait(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out = proc.stdout.read()  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    err_file.seek(0)
    err = err_file.read().decode(errors="replace")
    err_file.close()
    text = out.decode(errors="replace")
    if merge_stderr or proc.returncode not in (0, 1):
        text += err
    return wall, max(peak[0], usage.ru_maxrss) // 1024, proc.returncode, text, cpu


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--entries", type=int, default=2000, help="entries per rank (default 2000)")
    p.add_argument("--no-torchfrtrace", action="store_true", help="skip torchfrtrace (it needs torch)")
    p.add_argument("--repeat", type=int, default=2, help="runs of floor and diagnose; the fastest is kept")
    p.add_argument("--dir", type=Path, default=None, help="where to write the dumps (default: a temp dir)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    compile_package()
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-diagnose-"))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    rows = []
    print(f"{'ranks':>6} {'floor s':>8} {'diag s':>8} {'frtrace s':>9} {'speedup':>8} {'diag/floor':>10} "
          f"{'floor MiB':>9} {'diag MiB':>8} {'frtrace MiB':>11} {'mem ratio':>9} {'diag ms/rank':>12} "
          f"{'CPU s floor/diag/frtrace':>24} {'load':>5}")
    for world in args.ranks:
        folder = root / f"ranks{world}"
        shutil.rmtree(folder, ignore_errors=True)
        culprit = write_dumps(folder, world, args.entries)
        floor = min((measure([sys.executable, "-c", _FLOOR, str(folder)], env) for _ in range(args.repeat)),
                    key=lambda m: m[0])
        diag = min((measure([sys.executable, "-m", "comm2perfetto.cli", "diagnose", str(folder), "--format",
                             "json"], env) for _ in range(args.repeat)), key=lambda m: m[0])
        if diag[2] != 1:
            raise SystemExit(f"diagnose exited {diag[2]} on {world} ranks:\n{diag[3][-2000:]}")
        finding = json.loads(diag[3])["findings"][0]
        if finding["culprit_ranks"] != [culprit] or finding["kind"] != "missing_ranks":
            raise SystemExit(f"diagnose did not find the planted rank {culprit}: {finding}")
        row = {"ranks": world, "entries_per_rank": args.entries, "floor_s": floor[0], "floor_mib": floor[1],
               "floor_cpu_s": floor[4], "diagnose_s": diag[0], "diagnose_mib": diag[1], "diagnose_cpu_s": diag[4],
               "load_average": os.getloadavg()[0]}
        fr_text = "-"
        if not args.no_torchfrtrace:
            fr = measure([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder)], env,
                         merge_stderr=True)
            if f"missing ranks: {{{culprit}}}" not in fr[3]:
                raise SystemExit(f"torchfrtrace did not report rank {culprit} missing:\n{fr[3][-3000:]}")
            row.update(torchfrtrace_s=fr[0], torchfrtrace_mib=fr[1], torchfrtrace_cpu_s=fr[4])
            fr_text = f"{fr[4]:.2f}"
        rows.append(row)
        fr_s, fr_mib = row.get("torchfrtrace_s"), row.get("torchfrtrace_mib")
        speedup = f"{fr_s / diag[0]:.1f}x" if fr_s else "-"
        mem = f"{diag[1] / fr_mib:.2f}" if fr_mib else "-"
        cpu = f"{floor[4]:.2f}/{diag[4]:.2f}/{fr_text}"
        print(f"{world:>6} {floor[0]:>8.2f} {diag[0]:>8.2f} {(f'{fr_s:.2f}' if fr_s else '-'):>9} {speedup:>8} "
              f"{diag[0] / floor[0]:>9.2f}x {floor[1]:>9} {diag[1]:>8} {(fr_mib or '-'):>11} {mem:>9} "
              f"{diag[0] / world * 1000:>12.1f} {cpu:>24} {row['load_average']:>5.1f}", flush=True)
        shutil.rmtree(folder)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
