"""The live verdict's launcher side: ``comm2perfetto record`` prints who a stalled job waits for, while it hangs.

A thread of ``record`` watches the recording folder for the snapshots the job's ranks gather at a stall
(record/live.py writes ``.live/stall.<gen>.json``, and ``.live/stall.<gen>.resolved.json`` when the stall is
over). Generations that describe one stall (several ranks detected it at once; none resolved in between) are
one stall: the verdict is printed once, and again only when a later snapshot of it is more complete (more
ranks answered) and says something else, so the printed verdict, ``stall-verdict.json`` and the last
``--on-stall`` call carry the most complete one. A rank that did not answer is looked up on this host (its pid
is in its event log's header): a process that exists but did not answer is frozen, and what was seen goes
into the job file (``probes``) for diagnose. Each time the picture changes (a new verdict, or every open stall
resolved) it prints the verdict in diagnose's words, writes it to ``stall-verdict.json`` and runs the user's
``--on-stall`` command with that JSON on stdin and its path in ``COMM2PERFETTO_VERDICT``. The command runs
in a session of its own, is killed after ``--on-stall-timeout`` seconds, and whatever it does only reaches
``.live/on-stall.log``: the job never waits for it. The event written and handed to the command::

    {"format": "comm2perfetto-stall-verdict", "version": 1, "event": "stall", "gen": 1, "attempt": 0,
     "t_ns": 1795313447406614332, "folder": "/home/me/run1", "verdict": {...diagnose --format json...}}

``event`` is ``stall`` or ``resolved`` (then ``verdict`` is the one that was resolved).
"""

from __future__ import annotations

import glob
import io
import os
import re
import socket
import sys
import time
from typing import Any, TextIO

import orjson

from comm2perfetto import layout
from comm2perfetto.hooks import HookRunner, Poller
from comm2perfetto.processes import CPU_SAMPLE_S, cpu_time_growth, process_state

EVENT_FORMAT = "comm2perfetto-stall-verdict"
DEFAULT_HOOK_TIMEOUT_S = 30.0
ENV_VERDICT_PATH = "COMM2PERFETTO_VERDICT"
_SNAPSHOT = re.compile(r"^stall\.(\d+)\.json$")
_RESOLVED = re.compile(r"^stall\.(\d+)\.resolved\.json$")


class StallWatcher(Poller):
    """Polls ``out_dir`` for live snapshots on a daemon thread; ``stop()`` ends it and waits for the commands."""

    def __init__(self, out_dir: str, on_stall: str | None = None, hook_timeout_s: float = DEFAULT_HOOK_TIMEOUT_S,
                 err: TextIO | None = None, poll_s: float = 0.5) -> None:
        super().__init__("live verdict", "comm2perfetto-live", poll_s)
        self._out_dir = out_dir
        self._live_dir = os.path.join(out_dir, layout.LIVE_DIR)
        self._err = err if err is not None else sys.stderr
        self._attempt = 0
        self._handled: set[int] = set()
        self._open: set[int] = set()
        self._resolved: set[int] = set()
        self._shown_key: Any = None
        self._shown: dict[str, Any] | None = None
        self._shown_answered = 0
        self._folder = out_dir  # the latest attempt's folder (poll)
        self.probes: list[dict[str, Any]] = []  # what was seen of ranks that did not answer, for the job file
        self._hooks = HookRunner(on_stall, hook_timeout_s, os.path.join(self._live_dir, "on-stall.log"),
                                 "--on-stall", self._say) if on_stall else None

    def poll(self) -> None:
        # Under torchrun's restarts the latest attempt gathers in its own folder (layout.attempt_dir), with
        # stall generations of its own: a new attempt starts the watching afresh.
        attempt, folder = max(layout.attempt_folders(self._out_dir).items())
        if attempt != self._attempt:
            self._attempt = attempt
            self._handled, self._open, self._resolved = set(), set(), set()
            self._shown_key, self._shown, self._shown_answered = None, None, 0
        self._folder = folder
        watched = os.path.join(folder, layout.LIVE_DIR)
        try:
            names = sorted(os.listdir(watched))
        except OSError:
            return
        for name in names:
            m = _SNAPSHOT.match(name)
            if m and int(m[1]) not in self._handled:
                self._handled.add(int(m[1]))
                self._on_snapshot(int(m[1]), os.path.join(watched, name))
        for name in names:
            m = _RESOLVED.match(name)
            if m and int(m[1]) in self._handled and int(m[1]) not in self._resolved:
                self._resolved.add(int(m[1]))
                self._open.discard(int(m[1]))
                if not self._open and self._shown is not None:
                    self._publish("resolved", int(m[1]), self._shown)
                    self._shown, self._shown_key, self._shown_answered = None, None, 0

    def _on_snapshot(self, gen: int, path: str) -> None:
        from comm2perfetto.diagnose.live import live_diagnosis
        from comm2perfetto.render.diagnosis_text import render_text
        from comm2perfetto.sources.live import LiveSnapshotError, read_snapshot

        try:
            snapshot = read_snapshot(path)
        except LiveSnapshotError as exc:
            self._say(f"live verdict: {exc}")
            return
        diagnosis = live_diagnosis(snapshot, self._probe_silent(snapshot))
        self._open.add(gen)
        verdict = diagnosis.to_json()
        key = [(f["kind"], f["group_uid"], f["seq"], f["culprit_ranks"], f["suspect_ranks"])
               for f in verdict["findings"]]
        answered = len(snapshot["ranks"])
        if self._shown is not None and (key == self._shown_key or answered < self._shown_answered):
            return  # the same stall again (another generation of it), or a less complete view of it
        self._shown_key, self._shown, self._shown_answered = key, verdict, answered
        text = io.StringIO()
        render_text(diagnosis, text)
        attempt = f" of attempt {self._attempt} (torchrun restarted the job)" if self._attempt else ""
        self._say(f"live verdict at stall {gen}{attempt} (the job is still running):\n{text.getvalue()}".rstrip())
        self._publish("stall", gen, verdict)

    def _probe_silent(self, snapshot: dict[str, Any]) -> dict[int, dict[str, Any]]:
        """Ranks that did not answer, whose process runs on this host: frozen when it is stopped (SIGSTOP), or
        running while its heartbeats stopped (the GIL held, stuck in C++). Every look goes to the job file."""
        from comm2perfetto.diagnose.weigh import FROZEN_GAP_NS
        from comm2perfetto.sources.event_log import last_heartbeat, read_header

        world = snapshot["world_size"] or 0
        answered = {s["rank"] for s in snapshot["ranks"]}
        here = socket.gethostname()
        frozen = {}
        for rank in sorted(set(range(world)) - answered)[:64]:
            path = os.path.join(self._folder, layout.event_log(rank))  # the attempt's logs
            header = read_header(path)
            if header is None or header.get("host") != here or not isinstance(header.get("pid"), int):
                continue
            probe = {"rank": rank, "pid": header["pid"], "state": process_state(header["pid"]),
                     "t_ns": time.time_ns(), "attempt": self._attempt}
            self.probes.append(probe)
            if probe["state"] == "stopped":
                frozen[rank] = dict(probe, detail="stopped (SIGSTOP, process state T)")
            elif probe["state"] == "running":
                last, recording_off = last_heartbeat(path)
                # No heartbeat at all: its recorder's thread never ran since the log was opened.
                since = last if last is not None else header.get("wall_ns")
                if isinstance(since, int) and not recording_off and probe["t_ns"] - since >= FROZEN_GAP_NS:
                    probe["state"] = "held"  # the process runs, its recorder's thread does not: the GIL is held
                    frozen[rank] = dict(probe, detail=_held_detail(header["pid"], (probe["t_ns"] - since) / 1e9,
                                                                   last is None))
        return frozen

    def _publish(self, event: str, gen: int, verdict: dict[str, Any]) -> None:
        doc = {"format": EVENT_FORMAT, "version": 1, "event": event, "gen": gen, "attempt": self._attempt,
               "t_ns": time.time_ns(), "folder": os.path.abspath(self._out_dir), "verdict": verdict}
        data = orjson.dumps(doc, option=orjson.OPT_INDENT_2)
        path = os.path.join(self._out_dir, layout.STALL_VERDICT_FILE)
        layout.write_whole(path, data)
        if event == "resolved":
            self._say(f"stall {gen} resolved: the job went on ({path})")
        else:
            self._say(f"verdict written to {path}")
        if self._hooks is not None:
            self._hooks.submit(event, data, {ENV_VERDICT_PATH: path})

    def _say(self, text: str) -> None:
        self._err.write("".join(f"comm2perfetto: {line}\n" if i == 0 else f"{line}\n"
                                for i, line in enumerate(text.split("\n"))))
        self._err.flush()


def stopped_ranks(out_dir: str) -> list[dict[str, Any]]:
    """Ranks of this host whose process is stopped (SIGSTOP, a debugger), found from their event logs' headers:
    at a signal `record` forwards, they are frozen ranks their launcher will kill later, which the job file
    says (``probes``)."""
    from comm2perfetto.sources.event_log import read_header

    out = []
    here = socket.gethostname()
    attempt, folder = max(layout.attempt_folders(out_dir).items())  # torchrun's latest attempt: the one running
    for path in sorted(glob.glob(os.path.join(folder, layout.EVENT_LOG_GLOB)))[:4096]:
        header = read_header(path)
        if header is None or header.get("host") != here or not isinstance(header.get("pid"), int) \
                or not isinstance(header.get("rank"), int):
            continue
        if process_state(header["pid"]) == "stopped":
            out.append({"rank": header["rank"], "pid": header["pid"], "state": "stopped", "t_ns": time.time_ns(),
                        "attempt": attempt})
    return out


def _held_detail(pid: int, silent_s: float, never: bool) -> str:
    """What is seen of a process whose recorder thread does not run: whether it burns CPU (a long C call or a
    runaway regex holding the GIL) or sleeps in C code that holds it."""
    used = cpu_time_growth(pid)
    what = (f"running on the CPU ({used:.2f} s of CPU in {CPU_SAMPLE_S:g} s)" if used is not None and used > 0
            else "asleep in C code" if used is not None else "running")
    silence = (f"its recorder's thread has not run once since it started {silent_s:.1f} s before" if never
               else f"its heartbeats stopped {silent_s:.1f} s before")
    return f"{what} while {silence}: it holds the GIL (a C extension loop, a long regex, a blocked C call)"
