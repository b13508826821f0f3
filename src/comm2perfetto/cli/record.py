"""``comm2perfetto record [options] -- COMMAND [ARGS...]``: run a job with recording in every rank."""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson

from comm2perfetto import layout
from comm2perfetto.cli import UserError
from comm2perfetto.record import flight
from comm2perfetto.record.config import DEFAULT_FR_BUFFER, DEFAULT_STALL_AFTER_S, RecordConfig, parse_step_range

BOOT_DIR = str(Path(__file__).resolve().parent.parent / "record" / "_boot")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "record",
        help="run a training job with communication recording in every rank",
        description="Run COMMAND (torchrun ..., python train.py, any launcher) with recording active in every "
                    "Python process that initialises torch.distributed. No change to the script is needed.",
        epilog="example: comm2perfetto record -o run1 -- torchrun --nproc_per_node 4 train.py",
    )
    p.add_argument("-o", "--out", metavar="DIR", help="output folder (default: ./comm2perfetto-<date-time>)")
    p.add_argument("--stall-after", metavar="SECONDS", default=str(DEFAULT_STALL_AFTER_S),
                   help="a collective pending this long makes every rank dump its stacks and Flight Recorder "
                        f"('off' to disable; default {DEFAULT_STALL_AFTER_S:g})")
    p.add_argument("--profile-steps", metavar="A-B", help="record steps A to B with torch.profiler")
    p.add_argument("--sync", action="store_true",
                   help="synchronise the device around each call (measures completion; changes timing)")
    p.add_argument("--no-modules", action="store_true",
                   help="do not track nn.Module paths (saves a few microseconds per module call)")
    p.add_argument("--fr-buffer", type=int, default=DEFAULT_FR_BUFFER, metavar="N",
                   help=f"Flight Recorder ring size to ask for (default {DEFAULT_FR_BUFFER})")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier recording in DIR")
    # dest is not "command": that is where the top-level parser keeps the subcommand's name (for messages).
    p.add_argument("job_command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]")
    p.set_defaults(func=run)


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
    try:
        out_dir = check_out_dir(args.out or default_out_dir())
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return RecordConfig(out_dir=out_dir, stall_after_s=stall, profile_steps=steps, sync=args.sync,
                        modules=not args.no_modules, fr_buffer=args.fr_buffer,
                        run_id=time.strftime("%Y%m%d-%H%M%S-") + str(os.getpid()))


def _existing_recording(out_dir: str) -> list[str]:
    return sorted(p for pattern in layout.RECORDING_GLOBS for p in glob.glob(os.path.join(out_dir, pattern)))


def child_environment(config: RecordConfig, base: dict[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """The environment every process of the job starts with, and warnings for the user."""
    env = dict(os.environ if base is None else base)
    env.update(config.to_env())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (BOOT_DIR, env.get("PYTHONPATH", "")) if p)
    warnings = flight.prepare_environment(env, config.fr_buffer, config.out_dir)
    return env, warnings


def run(args: argparse.Namespace) -> int:
    command = args.job_command[1:] if args.job_command[:1] == ["--"] else args.job_command
    if not command:
        raise UserError("no command given: comm2perfetto record [options] -- COMMAND [ARGS...]")
    if shutil.which(command[0]) is None:
        raise UserError(f"command not found: {command[0]}")
    unsupported = flight.unsupported_torch()
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
    env, warnings = child_environment(config)
    for warning in warnings:
        print(f"comm2perfetto: {warning}", file=sys.stderr)
    print(f"comm2perfetto: recording into {config.out_dir}", file=sys.stderr, flush=True)

    started = time.time_ns()
    status = _run_forwarding_signals(command, env)
    _write_job_file(config, command, started, status)
    _print_summary(config.out_dir, status, (time.time_ns() - started) / 1e9)
    return status


def _run_forwarding_signals(command: list[str], env: dict[str, str]) -> int:
    """Run the job in its own session so that a terminal's Ctrl-C reaches it once, through us."""
    try:
        child = subprocess.Popen(command, env=env, start_new_session=True)
    except OSError as exc:
        raise UserError(f"cannot start {command[0]}: {exc.strerror}") from None

    def forward(signum: int, _frame: object) -> None:
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        returncode = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return returncode if returncode >= 0 else 128 - returncode


def _write_job_file(config: RecordConfig, command: list[str], started: int, status: int) -> None:
    job = {
        "format": "comm2perfetto-job", "version": 1, "run_id": config.run_id, "command": command,
        "cwd": os.getcwd(), "started_ns": started, "ended_ns": time.time_ns(), "exit_status": status,
    }
    with open(os.path.join(config.out_dir, layout.JOB_FILE), "wb") as f:
        f.write(orjson.dumps(job, option=orjson.OPT_INDENT_2))


def _print_summary(out_dir: str, status: int, seconds: float) -> None:
    from comm2perfetto.sources.summary import counts_text, summarize

    summary = summarize(out_dir)
    err = sys.stderr
    print(f"comm2perfetto: job exited with status {status} after {seconds:.1f} s; "
          f"recorded {summary.ranks} rank(s) into {out_dir}", file=err)
    if summary.ranks == 0:
        print("comm2perfetto: no rank recorded anything: did the job call torch.distributed.init_process_group? "
              "Is comm2perfetto installed in the job's Python?", file=err)
        return
    if summary.calls or summary.fr_entries:
        print(f"  torch.distributed calls (patch layer): {counts_text(summary.calls)}", file=err)
        print(f"  Flight Recorder entries (also C++-issued): {counts_text(summary.fr_entries)}", file=err)
    print(f"  files: {summary.fr_files} Flight Recorder dumps, {summary.stack_files} stall stack dumps "
          f"({summary.stalls} stall(s) detected), {summary.profiler_traces} profiler traces", file=err)
    for problem in summary.unreadable:
        print(f"  unreadable: {problem}", file=err)
    trace = os.path.normpath(out_dir) + ".pftrace"
    print(f"comm2perfetto: next: comm2perfetto merge {out_dir} -o {trace}   (or: comm2perfetto diagnose {out_dir})",
          file=err)
