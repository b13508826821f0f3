"""The long run of the hostile-input property test: many mutated recordings, and docs/reliability.md's figures.

Runs ``tests/unit/test_sources_fuzz_inputs.py`` with ``COMM2PERFETTO_FUZZ_EXAMPLES`` examples (default 1000, each one
mutated recording run through diagnose, merge and report: 3000 runs, about ten minutes on 2 cores), then
prints what was tried and how it ended::

    python benchmarks/bench_fuzz.py                # 1000 examples
    python benchmarks/bench_fuzz.py --examples 200

Exit status: pytest's (0 when every run ended with 0, 1 or 2, without a traceback, in time, within memory).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--examples", type=int, default=1000, help="mutated recordings to try (default 1000)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        stats_path = Path(tmp) / "stats.json"
        env = dict(os.environ, COMM2PERFETTO_FUZZ_EXAMPLES=str(args.examples),
                   COMM2PERFETTO_FUZZ_STATS=str(stats_path))
        start = time.monotonic()
        rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout", "0",
                              str(ROOT / "tests" / "unit" / "test_sources_fuzz_inputs.py")], cwd=ROOT, env=env)
        secs = time.monotonic() - start
        if not stats_path.exists():
            print("no statistics written (the test did not reach its end)")
            return rc or 1
        stats = json.loads(stats_path.read_text())
    runs = sum(stats["status"].values())
    kinds = stats["kinds"]
    families = sorted({k.split(":")[0].split("(")[0] for k in kinds})
    print(f"\n{stats['examples']:,} mutated recordings ({len(kinds)} kinds in {len(families)} families: "
          f"{', '.join(families)}); {runs:,} runs of diagnose, merge and report in {secs:.0f} s")
    print("exit statuses: " + ", ".join(f"{k}: {v:,}" for k, v in sorted(stats["status"].items())))
    print(f"tracebacks: {stats['tracebacks']}, hangs: {stats['hangs']}, slowest run: {stats['slowest_s']:.2f} s, "
          f"peak resident memory of a run: {stats['peak_rss_bytes'] / 2**20:.0f} MiB")
    return rc


if __name__ == "__main__":
    sys.exit(main())
