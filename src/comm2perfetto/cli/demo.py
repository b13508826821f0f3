"""``comm2perfetto demo``: record the bundled DDP example on CPU/gloo, merge it into a trace, report on it and
diagnose it.

The quickest way to see what comm2perfetto produces, on a laptop with no GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from comm2perfetto.cli import UserError

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ddp_train.py"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="record, merge, report and diagnose a small DDP job on CPU (gloo)",
                       description="Run the bundled DDP example with torchrun under 'comm2perfetto record' "
                                   "(steps 5-8 also with torch.profiler), merge the recording into DIR.pftrace "
                                   "(plus a DIR.png preview), report on it (plus DIR.html), then diagnose it.")
    p.add_argument("-o", "--out", metavar="DIR", help="output folder (default: ./comm2perfetto-<date-time>)")
    p.add_argument("--nproc", type=int, default=2, help="ranks to run (default 2)")
    p.add_argument("--steps", type=int, default=20, help="training steps per epoch, 2 epochs (default 20)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from comm2perfetto.cli import main as cli_main
    from comm2perfetto.record.api import default_out_dir

    if args.nproc < 1:
        raise UserError("--nproc must be at least 1")
    out = args.out or default_out_dir()
    status = cli_main([
        "record", "-o", out, "--overwrite", "--profile-steps", "5-8", "--",
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.nproc),
        "--standalone", str(EXAMPLE), "--steps", str(args.steps),
    ])
    if status != 0:
        print(f"comm2perfetto demo: the example job failed (status {status})", file=sys.stderr)
        return status
    # Next to the folder, not in it: a later merge or diagnose of the folder should not meet them.
    trace = str(Path(out).resolve()) + ".pftrace"
    stem = trace.removesuffix(".pftrace")
    status = cli_main(["merge", out, "-o", trace, "--preview", stem + ".png"])
    if status != 0:
        return status
    status = cli_main(["report", out, "--plot", stem + ".html"])
    if status != 0:
        return status
    return cli_main(["diagnose", out])
