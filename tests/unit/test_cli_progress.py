"""Progress lines: silent for short work, throttled, one rewritten line on a terminal."""

from __future__ import annotations

import io

from comm2perfetto.cli import progress as progress_mod
from comm2perfetto.cli.progress import Progress


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_short_work_prints_nothing(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(progress_mod.time, "monotonic", clock)
    out = io.StringIO()
    p = Progress("reading", out)
    for done in range(1, 11):
        clock.now += 0.05  # all of it within the first second
        p(done, 10)
    p.finish()
    assert out.getvalue() == ""


def test_log_file_gets_a_line_every_ten_seconds_and_the_last(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(progress_mod.time, "monotonic", clock)
    out = io.StringIO()
    p = Progress("reading", out)
    for done in range(1, 101):
        clock.now += 0.5  # 50 s in all
        p(done, 100)
    p.finish()
    lines = out.getvalue().splitlines()
    # First after the quiet second (t=1.0: done=2), then every 10 s (20 calls), and the final 100/100.
    assert lines == [f"comm2perfetto: reading: {d}/100 ({d}%)" for d in (2, 22, 42, 62, 82, 100)]


def test_terminal_rewrites_one_line(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(progress_mod.time, "monotonic", clock)
    out = Terminal()
    p = Progress("reading", out)
    for done in range(1, 5):
        clock.now += 0.6
        p(done, 4)
    p.finish()
    text = out.getvalue()
    assert text.count("\r") == 3 and text.endswith("comm2perfetto: reading: 4/4 (100%)\n")
    assert "\n" not in text[:-1]
