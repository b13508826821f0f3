"""How long ``render_preview`` takes on big jobs: 256 ranks x 8000 spans and 1024 ranks x 2000 spans.

The spans alternate compute and communication with varying lengths (a deterministic pseudo-random
sequence), the last rank stalls near the end and every 16th rank has a missing-collective mark, so every
code path of the renderer runs. Building the rows is not timed; rendering and writing the PNG is::

    python benchmarks/bench_preview.py
    python benchmarks/bench_preview.py --out /tmp/bench.png   # keep the last picture
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time

from comm2perfetto.trace.preview import PreviewRow, render_preview

T0_NS = 1_795_313_447_000_000_000


def make_rows(n_rows: int, spans_per_row: int, seed: int = 7) -> tuple[list[PreviewRow], int]:
    """Rows of back-to-back compute/comm spans, with some overlap; returns them and the window's end."""
    rng = random.Random(seed)
    rows = []
    t_end = T0_NS
    for r in range(n_rows):
        t = T0_NS + rng.randrange(0, 200_000)
        spans = []
        for k in range(spans_per_row):
            d = rng.randrange(200_000, 1_500_000)
            # Comm sometimes starts before compute ends: the overlap case the picture splits rows for.
            spans.append((t, t + d, "compute" if k % 2 == 0 else "comm"))
            t += d - (rng.randrange(0, d // 2) if k % 7 == 0 else 0)
        if r == n_rows - 1:
            spans.append((t - 5_000_000, t, "stalled"))
        rows.append(PreviewRow(f"rank {r}", spans, [(t, "missing")] if r % 16 == 0 else ()))
        t_end = max(t_end, t)
    return rows, t_end


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="where to write the PNG (default: a temporary file, deleted)")
    args = ap.parse_args()
    for n_rows, per_row in ((256, 8000), (1024, 2000)):
        rows, t1 = make_rows(n_rows, per_row)
        with tempfile.TemporaryDirectory() as tmp:
            path = args.out or os.path.join(tmp, "preview.png")
            start = time.perf_counter()
            stats = render_preview(path, rows, T0_NS, t1, title=f"bench: {n_rows} ranks x {per_row} spans",
                                   notes=[f"{n_rows * per_row} spans"])
            took = time.perf_counter() - start
        print(f"{n_rows:5d} rows x {per_row:5d} spans = {n_rows * per_row:8d}: {took:6.2f} s  "
              f"({stats.width}x{stats.height} px, {stats.bytes / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
