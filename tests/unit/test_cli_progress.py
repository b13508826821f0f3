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


def test_a_pipe_gets_nothing(monkeypatch):
    import os

    clock = FakeClock()
    monkeypatch.setattr(progress_mod.time, "monotonic", clock)
    read, write = os.pipe()
    with os.fdopen(write, "w") as pipe:
        p = Progress("reading", pipe)
        for done in range(1, 101):
            clock.now += 0.5
            p(done, 100)
        p.finish()
    with os.fdopen(read) as r:
        assert r.read() == ""


def test_a_phase_shows_its_elapsed_time_on_a_terminal_only():
    import time

    from comm2perfetto.cli.progress import Phase

    out = Terminal()
    with Phase("matching", out, quiet_s=0.05, every_s=0.05):
        time.sleep(0.5)
    text = out.getvalue()
    assert text.startswith("\rcomm2perfetto: matching... 0 s") and text.endswith("\n")
    log = io.StringIO()
    with Phase("matching", log, quiet_s=0.0, every_s=0.01):
        time.sleep(0.1)
    assert log.getvalue() == ""


def test_counted_work_hands_over_to_the_phase_after_it():
    import time

    out = Terminal()
    p = Progress("reading", out, quiet_s=0.0, then="matching")
    p(1, 2)
    p(2, 2)
    time.sleep(0.3)
    p.finish()
    text = out.getvalue()
    assert "reading: 2/2 (100%)\n" in text and "comm2perfetto: matching... " in text and text.endswith("\n")
