"""torch.profiler: our own window of steps, and a copy of every trace the user's profilers produce.

Every finished Kineto trace passes through ``torch.profiler.profile._trace_ready`` (it then calls the user's
``on_trace_ready``, if any). Wrapping that method at class level saves each trace into the output folder as
``rank<R>.kineto.<n>.json.gz`` after the user's handler ran, for profilers created before or after recording
started, and also counts ``prof.step()`` calls as step boundaries.

``--profile-steps A-B`` starts a profiler when step A begins and stops it when step B ends, stepping it at each
step in between so that its trace has ``ProfilerStep#A`` ... ``ProfilerStep#B`` (the steps readers project onto
the GPU). Kineto runs one profiler at a time, so the window is skipped (with a warning in the log) while the
user's own is active.
"""

from __future__ import annotations

import functools
import gzip
import inspect
import os
import shutil
import time
from typing import TYPE_CHECKING, Any

import orjson

from comm2perfetto import layout

if TYPE_CHECKING:
    from comm2perfetto.record.view import RecorderView

_originals: dict[str, Any] = {}


class ProfilerCapture:
    def __init__(self, recorder: RecorderView, out_dir: str, steps: tuple[int, int] | None) -> None:
        self._recorder = recorder
        self._out_dir = out_dir
        self._steps = steps
        self._count = 0
        self._ours: Any = None

    def install(self) -> None:
        import torch.profiler

        cls = torch.profiler.profile
        if "_trace_ready" in _originals:
            return
        capture = self
        trace_ready, step = cls._trace_ready, cls.step
        _originals["_trace_ready"], _originals["step"] = trace_ready, step

        @functools.wraps(trace_ready)
        def _trace_ready(prof: Any) -> None:
            trace_ready(prof)
            capture.save(prof)

        @functools.wraps(step)
        def step_(prof: Any) -> None:
            step(prof)
            if prof is not capture._ours:
                capture._recorder.steps.on_profiler_step()

        cls._trace_ready, cls.step = _trace_ready, step_
        if self._steps is not None:
            self._recorder.steps.listeners.append(self.on_step)
            self.on_step(self._recorder.steps.current)

    def uninstall(self) -> None:
        import torch.profiler

        for name, original in _originals.items():
            setattr(torch.profiler.profile, name, original)
        _originals.clear()
        if self._ours is not None:
            self._stop_ours()

    def save(self, prof: Any) -> None:
        from comm2perfetto.record import state

        rec = self._recorder
        if state.recorder is not rec:
            return
        try:
            name = layout.kineto(rec.rank, self._count + 1)
            _export_gzip(prof, os.path.join(self._out_dir, name))
            self._count += 1
            rec.log.write(["t", time.time_ns(), name])
        except Exception as exc:
            rec.warn(f"could not save a profiler trace: {type(exc).__name__}: {exc}")

    def on_step(self, step: int) -> None:
        first, last = self._steps  # type: ignore[misc]
        if step == first and self._ours is None:
            self._start_ours(first)
        elif step == last + 1 and self._ours is not None:
            self._stop_ours()
        elif first < step <= last and self._ours is not None:
            self._ours.step()  # ends ProfilerStep#(step - 1), opens ProfilerStep#step

    def _start_ours(self, first: int) -> None:
        import torch
        from torch.profiler import ProfilerAction, ProfilerActivity, profile

        if torch.autograd.profiler._is_profiler_enabled:
            self._recorder.warn("--profile-steps window skipped: another profiler is already running")
            return
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        # A schedule that always records makes the profiler mark its steps (torch records ProfilerStep#N
        # only for a scheduled profiler); numbered from the window's first step, as the job counts them.
        # One window is one cycle, so accumulating across cycles changes nothing here; torch 2.10-2.12 warn on
        # every prepared trace without it ("Profiler clears events at the end of each cycle"), in the job's
        # output.
        quiet = {"acc_events": True} if "acc_events" in inspect.signature(profile).parameters else {}
        self._ours = profile(activities=activities, schedule=lambda _: ProfilerAction.RECORD, **quiet)
        self._ours.step_num = first
        self._ours.start()

    def _stop_ours(self) -> None:
        ours, self._ours = self._ours, None
        ours.stop()  # -> _trace_ready -> save()


def _export_gzip(prof: Any, path: str) -> None:
    """Kineto saves a trace only once ("Trace is already saved"): when the user's ``on_trace_ready`` exported
    it already (``tensorboard_trace_handler`` does), export it again from the results in Python."""
    try:
        prof.export_chrome_trace(path)
        return
    except RuntimeError:
        pass
    tmp = path + ".tmp.json"
    try:
        if "use_python_export" in inspect.signature(prof.export_chrome_trace).parameters:  # torch >= 2.13
            prof.export_chrome_trace(tmp, use_python_export=True)
        else:
            _export_function_events(prof, tmp)
        with open(tmp, "rb") as src, gzip.open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _export_function_events(prof: Any, path: str) -> None:
    """Torch before 2.13 has no Python export of Kineto's results; its profiler's function events export as
    a bare JSON list of events timed in microseconds from the trace's start, e.g.
    ``[{"name": "c10d::allreduce_", "ph": "X", "ts": 1520.3, "dur": 210.4, "tid": 1, "pid": "CPU functions",
    "args": {}}]``. Wrapped here with the start (``baseTimeNanoseconds``) and ``distributedInfo`` that Kineto's
    own file has, so readers place it like any other trace."""
    prof.events().export_chrome_trace(path)
    with open(path, "rb") as f:
        events = orjson.loads(f.read())
    doc = {"schemaVersion": 1, "distributedInfo": prof._get_distributed_info(),
           "baseTimeNanoseconds": prof.profiler.kineto_results.trace_start_ns(), "traceEvents": events}
    with open(path, "wb") as f:
        f.write(orjson.dumps(doc))
