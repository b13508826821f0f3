"""``comm2perfetto demo``: record the bundled DDP example on CPU/gloo, merge it into a trace, report on it and
diagnose it.

The quickest way to see what comm2perfetto produces, on a laptop with no GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from comm2perfetto.cli import UserError, exit_status, require_torch
from comm2perfetto.cli.record import add_output_dir

__all__ = ["add_parser", "run"]

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ddp_train.py"
PROFILE_STEPS = "5-8"
# What the example's processes would print that says nothing about the demo: torch's warning when NumPy is
# not installed (the record extra brings none; the example does not need it), Kineto's USDT probe lines around
# each profiled window, and torchrun's banner about OMP_NUM_THREADS (it sets 1 anyway; so do we).
QUIET_JOB_ENV = {"PYTHONWARNINGS": "ignore:Failed to initialize NumPy", "KINETO_LOG_LEVEL": "6",
                 "OMP_NUM_THREADS": "1"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="record, merge, report and diagnose a small DDP job on CPU (gloo)",
                       description="Run the bundled DDP example with torchrun under 'comm2perfetto record' "
                                   f"(steps {PROFILE_STEPS} also with torch.profiler), merge the recording into "
                                   "DIR.pftrace (plus a DIR.png preview), report on the profiled steps (plus "
                                   "DIR.html), then diagnose it.",
                       epilog=exit_status("0  every step ran and diagnose found nothing",
                                          "1  diagnose found a problem",
                                          "N  the example job's exit status, when it failed"))
    add_output_dir(p)
    p.add_argument("--nproc-per-node", "--nproc_per_node", "--nproc", dest="nproc", type=int, default=2,
                   metavar="N", help="ranks to run, as torchrun's option of that name (default 2)")
    p.add_argument("--steps", type=int, default=20, help="training steps per epoch, 2 epochs (default 20)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier recording in DIR and DIR.pftrace, DIR.png, DIR.html")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from comm2perfetto.cli import main as cli_main
    from comm2perfetto.record.api import default_out_dir

    require_torch("demo")
    if args.nproc < 1:
        raise UserError("--nproc-per-node must be at least 1")
    last_profiled = int(PROFILE_STEPS.split("-")[1])
    if 2 * args.steps < last_profiled:
        raise UserError(f"--steps {args.steps}: the demo profiles steps {PROFILE_STEPS} of 2 epochs; give at least "
                        f"{(last_profiled + 1) // 2}")
    out = args.out or default_out_dir()
    # Next to the folder, not in it: a later merge or diagnose of the folder should not meet them.
    stem = str(Path(out).resolve())
    products = [stem + suffix for suffix in (".pftrace", ".png", ".html")]
    taken = [p for p in products if os.path.exists(p)]
    if taken and not args.overwrite:
        raise UserError(f"{taken[0]} exists{f' (and {len(taken) - 1} more)' if len(taken) > 1 else ''}; "
                        "choose a new folder with -o or pass --overwrite")
    quiet = [f"{name}={value}" for name, value in QUIET_JOB_ENV.items() if name not in os.environ]
    status = cli_main(["record", "-o", out, "--profile-steps", PROFILE_STEPS, *(["--overwrite"] * args.overwrite),
                       "--", "env", *quiet, sys.executable, "-m", "torch.distributed.run",
                       "--nproc-per-node", str(args.nproc), "--standalone", str(EXAMPLE), "--steps", str(args.steps)])
    if status != 0:
        if status != 2:  # record printed why already
            print(f"comm2perfetto demo: the example job failed (status {status})", file=sys.stderr)
        return status
    status = cli_main(["merge", out, "-o", products[0], "--preview", products[1]])
    if status != 0:
        return status
    print(f"comm2perfetto demo: reporting on steps {PROFILE_STEPS}, the profiled ones (compute is measured only "
          "there)", file=sys.stderr)
    status = cli_main(["report", out, "--steps", PROFILE_STEPS, "--plot", products[2]])
    if status != 0:
        return status
    return cli_main(["diagnose", out])
