"""What comm2perfetto still has installed in the test process, and a best-effort clean-up: the autouse fixture
``_no_recorder_left_behind`` in tests/conftest.py fails a test that leaves any of it behind, as pyinstrument's
suite does for its profilers. Imports no torch."""

from __future__ import annotations

import signal
import sys


def recorder_leftovers() -> list[str]:
    """What comm2perfetto still has installed in this process (imports no torch)."""
    from comm2perfetto.record import bootstrap, capture, dispatch, nvtx, patch, profiler, session, state

    left = []
    if patch.installed():
        left.append("torch.distributed patches (patch.uninstall())")
    if dispatch.installed():
        left.append("the dispatcher fallback's kernels (dispatch.uninstall())")
    if state.recorder is not None:
        left.append("an active recorder (state.recorder)")
    if bootstrap._finder in sys.meta_path:
        left.append("the post-import hook (bootstrap.remove_hooks())")
    if nvtx._patched:
        left.append("NVTX mirroring (nvtx.unmirror_all())")
    if profiler._originals:
        left.append("the torch.profiler wrappers")
    if capture._patched:
        left.append("the CUDA graph capture wrappers (capture.uninstall())")
    if session._parts:
        left.append(f"session parts {sorted(session._parts)}")
    if session._previous_excepthook is not None or sys.excepthook is session._on_uncaught:
        left.append("the sys.excepthook (session.remove_exit_handlers())")
    if session._on_signal in (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)):
        left.append("the SIGTERM/SIGINT handlers (session.remove_exit_handlers())")
    return left


def clean_up_recorder() -> None:
    """Best effort, so that one leaky test does not make every later test fail too."""
    from comm2perfetto.record import bootstrap, capture, dispatch, nvtx, patch, session, state

    try:
        session.stop("test-cleanup")
    except Exception as exc:  # the leak is reported anyway; keep cleaning
        print(f"clean_up_recorder: stopping the leaked recorder failed: {exc!r}", file=sys.stderr)
    dispatch.uninstall()
    session.remove_exit_handlers()
    session.configure(None)
    session._parts.clear()
    state.recorder = None
    patch.uninstall()
    nvtx.unmirror_all()
    capture.uninstall()
    bootstrap.remove_hooks()

