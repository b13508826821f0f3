"""``comm2perfetto record [options] -- COMMAND [ARGS...]``: run a job with recording in every rank."""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
import time

from comm2perfetto import layout
from comm2perfetto.cli import UserError, exit_status, require_torch
from comm2perfetto.launch import child_environment, run_forwarding_signals, write_job_file
from comm2perfetto.record import mechanisms
from comm2perfetto.record.config import (
    DEFAULT_FR_BUFFER,
    DEFAULT_LIVE_EVERY_S,
    DEFAULT_STALL_AFTER_S,
    ENV_RUN_ID,
    MIN_LIVE_EVERY_S,
    RecordConfig,
    parse_step_range,
)

__all__ = ["add_output_dir", "add_parser", "run"]

def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "record", usage="comm2perfetto record [options] -- COMMAND [ARGS...]",
        help="run a training job with communication recording in every rank",
        description="Run COMMAND (torchrun ..., python train.py, any launcher) with recording active in every "
                    "Python process that initialises torch.distributed. No change to the script is needed.",
        epilog="example:\n  comm2perfetto record -o run1 -- torchrun --nproc-per-node 4 train.py --my-args\n\n"
               + exit_status("N  the job's own exit status (128+S when a signal S ended it)"),
    )
    add_output_dir(p)
    p.add_argument("--stall-after", metavar="SECONDS", default=str(DEFAULT_STALL_AFTER_S),
                   help="a collective pending this long makes every rank dump its stacks and Flight Recorder "
                        f"('off' to disable; default {DEFAULT_STALL_AFTER_S:g})")
    p.add_argument("--profile-steps", metavar="A-B", help="record steps A to B with torch.profiler")
    p.add_argument("--sync", action="store_true",
                   help="synchronise the call's GPU around each call (measures completion; changes timing)")
    p.add_argument("--no-modules", action="store_true",
                   help="do not track nn.Module paths (saves a few microseconds per module call)")
    p.add_argument("--no-gpu-timing", action="store_true",
                   help="do not time NCCL collectives with CUDA events (TORCH_NCCL_ENABLE_TIMING; on by default "
                        "unless you set it)")
    p.add_argument("--fr-buffer", type=int, default=DEFAULT_FR_BUFFER, metavar="N",
                   help=f"Flight Recorder ring size to ask for (default {DEFAULT_FR_BUFFER})")
    p.add_argument("--on-stall", metavar="CMD",
                   help="at a stall, run this shell command with the live verdict's JSON on stdin (its path in "
                        "$COMM2PERFETTO_VERDICT), e.g. 'curl -d @- https://hooks.example/...'; again when it resolves")
    p.add_argument("--on-stall-timeout", metavar="SECONDS", type=float, default=30.0,
                   help="kill the --on-stall command after this long (default 30)")
    p.add_argument("--live-every", metavar="SECONDS", default=f"{DEFAULT_LIVE_EVERY_S:g}",
                   help="summarise each window of this many seconds on every rank, gather them through the job's "
                        "store and name stragglers (live/stragglers.jsonl), write live/metrics.prom and "
                        f"live/window.json (comm2perfetto top); 'off' to disable (default {DEFAULT_LIVE_EVERY_S:g})")
    p.add_argument("--metrics-dir", metavar="DIR2",
                   help="write metrics.prom (Prometheus text format) here rather than in DIR/live, e.g. the folder a "
                        "node_exporter textfile collector reads")
    p.add_argument("--on-straggler", metavar="CMD",
                   help="when a rank starts or stops being a straggler, run this shell command with the event's JSON "
                        "on stdin")
    p.add_argument("--on-straggler-timeout", metavar="SECONDS", type=float, default=30.0,
                   help="kill the --on-straggler command after this long (default 30)")
    p.add_argument("--no-live-verdict", action="store_true",
                   help="at a stall, only dump stacks; do not gather every rank's position for a verdict while the "
                        "job hangs")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier recording in DIR")
    # dest is not "command": that is where the top-level parser keeps the subcommand's name (for messages).
    p.add_argument("job_command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]",
                   help="the job's launch command, after '--' (torchrun ..., python train.py ..., srun ...); "
                        "SIGINT and SIGTERM are forwarded to it")
    p.set_defaults(func=run)


def add_output_dir(p: argparse.ArgumentParser) -> None:
    """``-o/--output DIR``, as merge and report name their output; ``--out``, the spelling of the first
    releases, still works."""
    p.add_argument("-o", "--output", dest="out", metavar="DIR",
                   help="output folder (default: ./comm2perfetto-<date-time>)")
    p.add_argument("--out", dest="out", help=argparse.SUPPRESS)


def _config_from_args(args: argparse.Namespace) -> RecordConfig:
    from comm2perfetto.record.api import check_out_dir, default_out_dir

    if args.stall_after.lower() == "off":
        stall = None
    else:
        try:
            stall = float(args.stall_after)
        except ValueError:
            raise UserError(f"--stall-after {args.stall_after!r}: give seconds (e.g. 60) or 'off'") from None
        if stall <= 0:
            raise UserError("--stall-after must be positive (or 'off')")
    try:
        steps = parse_step_range(args.profile_steps) if args.profile_steps else None
    except ValueError as exc:
        raise UserError(f"--profile-steps: {exc}") from None
    if args.fr_buffer < 1:
        raise UserError("--fr-buffer must be at least 1")
    if args.on_stall_timeout <= 0:
        raise UserError("--on-stall-timeout must be positive")
    if args.on_stall and (args.no_live_verdict or stall is None):
        raise UserError("--on-stall needs the live verdict: drop --no-live-verdict and --stall-after off")
    every = _live_every(args.live_every)
    if every is None and (args.on_straggler or args.metrics_dir):
        raise UserError("--on-straggler and --metrics-dir need the live windows: drop --live-every off")
    if args.on_straggler_timeout <= 0:
        raise UserError("--on-straggler-timeout must be positive")
    out_dir = check_out_dir(args.out or default_out_dir())
    # A run id the user (or a multi-node launcher script) set is kept: every node's `record` then writes the same.
    run_id = os.environ.get(ENV_RUN_ID) or time.strftime("%Y%m%d-%H%M%S-") + str(os.getpid())
    return RecordConfig(out_dir=out_dir, stall_after_s=stall, profile_steps=steps, sync=args.sync,
                        modules=not args.no_modules, fr_buffer=args.fr_buffer, live=not args.no_live_verdict,
                        gpu_timing=not args.no_gpu_timing, run_id=run_id, live_every_s=every)


def _live_every(text: str) -> float | None:
    if text.lower() == "off":
        return None
    try:
        every = float(text)
    except ValueError:
        raise UserError(f"--live-every {text!r}: give seconds (e.g. 60) or 'off'") from None
    if not every >= MIN_LIVE_EVERY_S or every == float("inf"):
        raise UserError(f"--live-every must be at least {MIN_LIVE_EVERY_S:g} seconds (or 'off')")
    return every


def _existing_recording(out_dir: str) -> list[str]:
    return sorted(p for pattern in layout.RECORDING_GLOBS for p in glob.glob(os.path.join(out_dir, pattern)))


def run(args: argparse.Namespace) -> int:
    require_torch("record")
    command = args.job_command[1:] if args.job_command[:1] == ["--"] else args.job_command
    if not command:
        raise UserError("no command given: comm2perfetto record [options] -- COMMAND [ARGS...]")
    if shutil.which(command[0]) is None:
        raise UserError(f"command not found: {command[0]}")
    unsupported = mechanisms.unsupported_torch()
    if unsupported is not None:
        raise UserError(unsupported)
    config = _config_from_args(args)
    existing = _existing_recording(config.out_dir)
    if existing:
        if not args.overwrite:
            raise UserError(f"{config.out_dir} already holds a recording ({len(existing)} files); "
                            f"choose a new folder with -o or pass --overwrite")
        for path in existing:
            os.remove(path)
        for folder in list(layout.attempt_folders(config.out_dir).values())[1:]:
            for empty in (os.path.join(folder, layout.LIVE_DIR), folder):
                try:
                    os.rmdir(empty)
                except OSError:
                    pass  # holds files of the user's: left as they are
    env, warnings = child_environment(config)
    for warning in warnings:
        print(f"comm2perfetto: {warning}", file=sys.stderr)
    print(f"comm2perfetto: recording into {config.out_dir}", file=sys.stderr)
    print(f"comm2perfetto: {mechanisms.startup_line()}", file=sys.stderr, flush=True)

    from comm2perfetto.exit_watch import ExitWatcher
    from comm2perfetto.stall_watch import StallWatcher, stopped_ranks
    from comm2perfetto.window_watch import WindowWatcher

    started = time.time_ns()
    exits = ExitWatcher(config.out_dir)  # when, and how, each rank's process ended: diagnose orders deaths by it
    exits.start()
    watcher = None
    if config.live and config.stall_after_s is not None:
        watcher = StallWatcher(config.out_dir, args.on_stall, args.on_stall_timeout)
        watcher.start()
    windows = None
    if config.live_every_s is not None:
        windows = WindowWatcher(config.out_dir, args.metrics_dir, args.on_straggler, args.on_straggler_timeout)
        windows.start()
    probes: list[dict] = []  # ranks' processes seen at a stall or a signal (frozen ones), for diagnose
    try:
        ending = run_forwarding_signals(command, env, lambda: probes.extend(stopped_ranks(config.out_dir)))
    finally:
        exits.stop()
        if watcher is not None:
            watcher.stop()
            probes.extend(watcher.probes)
        if windows is not None:
            windows.stop()
    write_job_file(config, command, started, ending, probes, exits.exits)
    _print_summary(config.out_dir, ending.status, time.time_ns() - started)
    return ending.status


def _print_summary(out_dir: str, status: int, elapsed_ns: int) -> None:
    from comm2perfetto.sources.summary import counts_text, stacks_text, summarize
    from comm2perfetto.words import duration

    attempts = layout.attempt_folders(out_dir)
    last = max(attempts)
    summary = summarize(attempts[last])
    err = sys.stderr
    print(f"comm2perfetto: job exited with status {status} after {duration(elapsed_ns)}; "
          f"recorded {summary.ranks} rank(s) into {out_dir}", file=err)
    if len(attempts) > 1:
        print(f"  torchrun restarted the job: attempts {', '.join(map(str, attempts))} kept apart, the last in "
              f"{attempts[last]}; the counts below are its own", file=err)
    if summary.ranks == 0:
        print("comm2perfetto: no rank recorded anything: did the job call torch.distributed.init_process_group? "
              "Is comm2perfetto installed in the job's Python?", file=err)
        return
    if summary.calls or summary.fr_entries or summary.cpp_calls:
        print(f"  torch.distributed calls (patch layer): {counts_text(summary.calls)}", file=err)
        if summary.cpp_calls:  # torch 2.4-2.7 on gloo: Flight Recorder has no gloo entries there
            print(f"  C++-issued collectives (dispatcher fallback): {counts_text(summary.cpp_calls)}", file=err)
        if summary.fr_entries or not summary.cpp_calls:
            print(f"  Flight Recorder entries (also C++-issued): {counts_text(summary.fr_entries)}", file=err)
    print(f"  files: {summary.fr_files} Flight Recorder dumps, {stacks_text(summary)}, "
          f"{summary.profiler_traces} profiler traces", file=err)
    for problem in summary.unreadable:
        print(f"  unreadable: {problem}", file=err)
    print(f"comm2perfetto: next: comm2perfetto merge {out_dir}   (writes {os.path.normpath(out_dir)}.pftrace; "
          f"or: comm2perfetto diagnose {out_dir})", file=err)
