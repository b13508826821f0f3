"""The public recording API: ``enable()``, ``disable()``, ``range()``, ``step()``.

Importing this module imports no torch, so ``import comm2perfetto`` stays cheap in the readers.
"""

from __future__ import annotations

import os
import sys
import time

from comm2perfetto.errors import OptionError
from comm2perfetto.record import state
from comm2perfetto.record.config import (
    DEFAULT_FR_BUFFER,
    DEFAULT_LIVE_EVERY_S,
    DEFAULT_STALL_AFTER_S,
    MIN_LIVE_EVERY_S,
    RecordConfig,
)
from comm2perfetto.record.nvtx import range

__all__ = ["check_out_dir", "default_out_dir", "disable", "enable", "range", "step"]


def default_out_dir() -> str:
    """``./comm2perfetto-YYYYmmdd-HHMMSS``: a new folder per run in the working directory."""
    return os.path.join(os.getcwd(), time.strftime("comm2perfetto-%Y%m%d-%H%M%S"))


def check_out_dir(path: str) -> str:
    """Create ``path`` if needed and prove it is writable. Returns the absolute path.

    Raises OptionError (a ValueError) with a message that says what to do.
    """
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise OptionError(f"{path} exists and is not a folder; choose another output folder with -o")
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".comm2perfetto-write-test-{os.getpid()}")
        with open(probe, "wb") as f:
            f.write(b"ok")
        os.remove(probe)
    except OSError as exc:
        raise OptionError(f"cannot write to {path} ({exc.strerror}); choose another output folder with -o") \
            from None
    return path


def enable(out_dir: str | None = None, *, stall_after: float | None = DEFAULT_STALL_AFTER_S,
           profile_steps: tuple[int, int] | None = None, sync: bool = False, modules: bool = True,
           fr_buffer: int = DEFAULT_FR_BUFFER, gpu_timing: bool = True,
           live_every: float | None = DEFAULT_LIVE_EVERY_S) -> str:
    """Record this process's communication into ``out_dir`` (what ``comm2perfetto record`` does for you).

    Call it before ``init_process_group`` to also get the largest Flight Recorder buffer and NCCL's GPU timing
    (both are read when the first process group is created); after it works too, recording starts at once,
    and a warning says what Flight Recorder ring is in effect. ``live_every``: the live windows' length in
    seconds (record's ``--live-every``), None for none. Returns the output folder.

    >>> import comm2perfetto
    >>> comm2perfetto.enable("c2p-run", stall_after=30)   # doctest: +SKIP
    """
    from comm2perfetto.record import bootstrap, flight, mechanisms, session

    if live_every is not None and not live_every >= MIN_LIVE_EVERY_S:
        raise OptionError(f"live_every={live_every!r}: give at least {MIN_LIVE_EVERY_S:g} seconds, or None")
    out_dir = check_out_dir(out_dir or default_out_dir())
    unsupported = mechanisms.unsupported_torch()
    if unsupported is not None:  # the job runs on, unrecorded
        print(f"comm2perfetto: {unsupported}; not recording", file=sys.stderr)
        return out_dir
    print(f"comm2perfetto: {mechanisms.startup_line()}", file=sys.stderr)
    dist = sys.modules.get("torch.distributed")
    started = dist is not None and dist.is_available() and dist.is_initialized()
    for warning in flight.prepare_environment(os.environ, fr_buffer, out_dir, gpu_timing, group_exists=started):
        print(f"comm2perfetto: {warning}", file=sys.stderr)
    config = RecordConfig(out_dir=out_dir, stall_after_s=stall_after, profile_steps=profile_steps,
                          sync=sync, modules=modules,
                          # after init_process_group the ring has its size: the dump schedule follows it
                          fr_buffer=flight.ring_in_effect(os.environ) if started else fr_buffer,
                          gpu_timing=gpu_timing, run_id=os.environ.get("COMM2PERFETTO_RUN_ID", ""),
                          live_every_s=live_every)
    session.configure(config)
    bootstrap.install_hooks()
    if started and dist is not None:
        session.on_default_group(dist.distributed_c10d._get_default_group())
    return out_dir


def disable() -> None:
    """Stop recording, write the last Flight Recorder dump and restore every patched function."""
    from comm2perfetto.record import bootstrap, nvtx, patch, session

    session.stop("disabled")
    session.remove_exit_handlers()
    session.configure(None)
    patch.uninstall()
    nvtx.unmirror_all()
    bootstrap.remove_hooks()


def step() -> None:
    """Mark a step boundary. Once called, automatic step detection (optimizer, profiler) is ignored."""
    rec = state.recorder
    if rec is not None:
        try:
            rec.steps.advance("user")
        except Exception as exc:
            rec.fault(exc)
