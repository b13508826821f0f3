"""Redraw the pictures the README shows (docs/img/*.png) from real runs of this checkout.

    python docs/make_pictures.py            # about a minute on 2 cores; needs the `test` extra and chromium

Three pictures, each what the tool itself draws:

- ``demo_steps.png``: ``merge --preview`` of ``comm2perfetto demo``'s recording, over its profiled steps 5-8
  (the only steps whose compute is known; outside them the preview is grey);
- ``demo_report.png``: the top of the demo's ``report --plot`` HTML page, as headless Chromium shows it
  (tests/support/browser.py drives it; Debian: ``apt-get install chromium``);
- ``hang_preview.png``: ``merge --preview`` of ``examples/hang_missing_rank.py`` interrupted while rank 1 is
  still away (recorded with ``--stall-after 3``, Ctrl-C a few seconds after the stall was detected).

Every command runs in a temporary folder; only the PNGs are written here. They are committed, so they are
shrunk to a palette (Pillow, which the ``test`` extra brings with matplotlib): a few KB to a few tens of KB.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMG = ROOT / "docs" / "img"
sys.path.insert(0, str(ROOT / "tests"))  # the browser driver the HTML tests use (tests/support/browser.py)

from support.browser import Browser, find_chromium  # noqa: E402

PROFILED_STEPS = (5, 8)  # comm2perfetto demo profiles these (and reports on them)
REPORT_WIDTH_PX = 1000
STALL_AFTER_S = 3
HANG_SECONDS = 120  # longer than the script waits: the job is interrupted while rank 1 is away
AFTER_STALL_S = 5.0  # how long the stall shows before the Ctrl-C


def comm2perfetto(*args: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "comm2perfetto", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=600)
    if done.returncode not in (0, 1):  # 1: diagnose found a problem (the hang), which is the point
        raise SystemExit(f"comm2perfetto {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMM2PERFETTO_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def profiled_window(chrome_json: Path) -> str:
    """``--window START:END`` (ms from the job's first event) around the demo's profiled steps, read from the
    merged trace's ``step N`` slices (Chrome JSON: ``ts`` and ``dur`` in microseconds)."""
    events = json.loads(chrome_json.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    first_us = min(e["ts"] for e in events if "ts" in e)
    first, last = PROFILED_STEPS
    steps = [e for e in events if e.get("cat") == "step" and first <= e.get("args", {}).get("step", -1) <= last]
    if not steps:
        raise SystemExit(f"the demo's trace has no steps {first}-{last}")
    begin_ms = (min(e["ts"] for e in steps) - first_us) / 1e3
    end_ms = (max(e["ts"] + e["dur"] for e in steps) - first_us) / 1e3
    margin_ms = (end_ms - begin_ms) * 0.02
    return f"{max(0.0, begin_ms - margin_ms):.3f}ms:{end_ms + margin_ms:.3f}ms"


def report_screenshot(html: Path, png: Path) -> None:
    """The page from its title down to the per-step table: header, job, the bars and each rank's numbers."""
    chromium = find_chromium()
    if chromium is None:
        raise SystemExit("no chromium on PATH (Debian: apt-get install chromium)")
    # a window taller than the part shown: a capture beyond the window lays the page out again, elsewhere
    with Browser(chromium, width=REPORT_WIDTH_PX, height=1400) as browser:
        browser.open(html.as_uri())
        browser.evaluate("document.documentElement.style.overflow = 'hidden'")  # no scroll bar in the picture
        # the bottom of what comes before the lateness map's heading: the per-step table
        bottom = browser.evaluate(
            "(() => { const h = [...document.querySelectorAll('h2')].find(e => e.textContent.startsWith('Lateness'));"
            " return h ? h.previousElementSibling.getBoundingClientRect().bottom : document.body.scrollHeight; })()")
        clip = {"x": 0, "y": 0, "width": REPORT_WIDTH_PX, "height": int(bottom) + 12, "scale": 1}
        data = browser.send("Page.captureScreenshot", {"format": "png", "clip": clip})["data"]
        if browser.errors:
            raise SystemExit(f"the report page reported errors: {browser.errors}")
    png.write_bytes(base64.b64decode(data))


def record_interrupted_hang(out: Path, cwd: Path) -> None:
    """Record the hang example and Ctrl-C it once the stall has been detected and has shown for a while."""
    job = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "examples" / "hang_missing_rank.py"), "--hang-seconds", str(HANG_SECONDS)]
    proc = subprocess.Popen([sys.executable, "-m", "comm2perfetto", "record", "-o", str(out), "--stall-after",
                             str(STALL_AFTER_S), "--", *job], cwd=cwd, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "stall-verdict.json").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the hang example showed no stall (record exit status {proc.poll()})")
            time.sleep(0.2)
        time.sleep(AFTER_STALL_S)
        proc.send_signal(signal.SIGINT)  # record forwards it to the job, as a Ctrl-C in its terminal would
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def shrink(png: Path, colours: int) -> None:
    """Re-encode with a palette of ``colours``: the previews use a dozen, the report page's text a few more."""
    try:
        from PIL import Image
    except ImportError:  # not shrunk, still right: say so
        print(f"{png.name}: Pillow is not installed, kept as drawn ({png.stat().st_size:,} bytes)")
        return
    with Image.open(png) as image:
        small = image.convert("RGB").quantize(colors=colours, method=Image.Quantize.MEDIANCUT)
    small.save(png, optimize=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=IMG, help="where the PNGs go (default: docs/img)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="c2p-pictures-") as tmp:
        work = Path(tmp)
        comm2perfetto("demo", "-o", "demo", cwd=work)
        comm2perfetto("merge", "demo", "-o", "demo.json", cwd=work)
        steps = args.out / "demo_steps.png"
        comm2perfetto("merge", "demo", "-o", "window.pftrace", "--window", profiled_window(work / "demo.json"),
                      "--preview", str(steps), cwd=work)
        report = args.out / "demo_report.png"
        report_screenshot(work / "demo.html", report)
        record_interrupted_hang(work / "hang", work)
        hang = args.out / "hang_preview.png"
        comm2perfetto("merge", "hang", "--preview", str(hang), cwd=work)
    for png, colours in ((steps, 16), (hang, 16), (report, 64)):
        shrink(png, colours)
        print(f"wrote {png.relative_to(ROOT) if png.is_relative_to(ROOT) else png} ({png.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
