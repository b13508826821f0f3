"""The generated fault matrix (issue 32): N real gloo jobs from specs drawn by a seed, each recorded with
``comm2perfetto record --stall-after 2`` under torchrun, hung ones ended as a user would (Ctrl-C once the live
verdict is out, or gloo's timeout), then diagnosed; ``diagnose``'s verdict and the live verdict (the last event
of ``stall-verdict.json``) are scored against what the spec makes true (tests/support/faults.py)::

    python benchmarks/fault_sweep.py --n 60 --seed 1 --jobs 3
    python benchmarks/fault_sweep.py --spec 'reorder@mesh,w=4,k=2,r=0+3,seed=17'   # one job again
    python benchmarks/fault_sweep.py --n 20 --seed 7 --format json > sweep.json

Per judge: right, partial (no innocent blamed, but the culprits only part of the truth, or the truth only among
the suspects), false_ok (a healthy verdict on a faulty job; live: none, or "resolved", where the job stalled),
innocent_blamed (a rank the spec did not fault named culprit), wrong (anything else), n/a (live: no stall to
judge), void (the job never got to its fault: not scored, listed apart). Each failing spec is printed as the
line ``--spec`` takes, with what each judge said and the truth. Progress goes to stderr; job folders go under
``--workdir`` (kept for the failing and void jobs).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.faults import (
    CATEGORIES,
    JUDGES,
    Outcome,
    Spec,
    SpecError,
    failing,
    generate,
    said,
    summary,
    sweep,
    truth,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=20, help="jobs to generate (default 20)")
    p.add_argument("--seed", type=int, default=0, help="the generator's seed (default 0)")
    p.add_argument("--spec", action="append", default=[], metavar="SPEC",
                   help="run this spec (repeatable) instead of generated ones")
    p.add_argument("--jobs", type=int, default=2, help="jobs run at once (default 2)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--workdir", type=Path, help="where the job folders go (default: a new temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep every job's folder, not only the failing ones'")
    args = p.parse_args(argv)
    try:
        specs = [Spec.parse(s) for s in args.spec] or generate(args.n, args.seed)
    except SpecError as exc:
        p.error(str(exc))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fault-sweep-"))
    workdir.mkdir(parents=True, exist_ok=True)
    done = [0]

    def progress(_i: int, o: Outcome) -> None:
        done[0] += 1
        scores = " ".join(f"{j}={o.scores[j]}" for j in JUDGES)
        print(f"[{done[0]}/{len(specs)}] {o.spec}  {scores}  ({o.wall_s:.1f} s, {o.ended_by})", file=sys.stderr,
              flush=True)

    start = time.monotonic()
    outcomes = sweep(specs, workdir, args.jobs, progress)
    wall = time.monotonic() - start
    for o in outcomes:
        if o.reached and not failing(o) and not args.keep:
            shutil.rmtree(o.folder, ignore_errors=True)
    doc = summary(outcomes)
    doc.update(seed=None if args.spec else args.seed, wall_s=round(wall, 1), jobs_at_once=min(args.jobs, len(specs)),
               workdir=str(workdir))
    if args.format == "json":
        print(json.dumps(doc, indent=2))
    else:
        print_text(doc, outcomes)
    return 0


def print_text(doc: dict, outcomes: list[Outcome]) -> None:
    print(f"{doc['jobs']} jobs in {doc['wall_s']:.0f} s ({doc['jobs_at_once']} at once; a job {doc['mean_job_s']} s "
          f"on average), folders under {doc['workdir']}")
    print(f"{'':10}" + "".join(f"{c:>17}" for c in CATEGORIES))
    for judge in JUDGES:
        print(f"{judge:10}" + "".join(f"{doc['counts'][judge][c]:>17}" for c in CATEGORIES))
    by_fault: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        if failing(o):
            by_fault[o.spec.fault].append(o)
    for f in doc["void"]:
        print(f"void (the job never got to its fault, not scored): {f['spec']}; ended by {f['ended_by']}, exit "
              f"{f['returncode']}; {f['job']}")
    if by_fault:
        print("\nfailing specs, by fault:")
    for fault, group in sorted(by_fault.items()):
        print(f"{fault}:")
        for o in group:
            t = truth(o.spec)
            print(f"  {o.spec}")
            print(f"    diagnose {o.scores['diagnose']}: {said(o.diagnose)}")
            print(f"    live {o.scores['live']}: {said(o.live)}  (--on-stall got {o.hook_events or 'nothing'})")
            print(f"    truth: culprits {sorted(t.culprits)}, diagnose {'/'.join(sorted(t.diagnose))}, live "
                  f"{'/'.join(sorted(t.live)) or '-'}; ended by {o.ended_by}, exit {o.returncode}; {o.folder}/job.py")


if __name__ == "__main__":
    sys.exit(main())
