"""Lifecycle of recording in one process: configure, start when the default group appears, stop.

Start-up opens ``rank<R>.events.jsonl``, writes its header, declares the default group, installs the step,
module, profiler and NVTX instrumentation, starts the clock measurement and the watchdog, and arranges for
Flight Recorder to be dumped at exit, on an uncaught exception and on SIGTERM/SIGINT. A forked child (a
DataLoader worker) forgets all of it: only the rank process writes its files.
"""

from __future__ import annotations

import atexit
import functools
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from comm2perfetto import layout
from comm2perfetto.record import capture, clock, state
from comm2perfetto.record.config import RecordConfig
from comm2perfetto.record.flight import FlightRecorderDumps, follow_attempt
from comm2perfetto.record.log import EventLog
from comm2perfetto.record.mechanisms import gloo_fallback_wanted, mechanisms, unsupported_torch

if TYPE_CHECKING:
    from comm2perfetto.record.recorder import Recorder

_config: RecordConfig | None = None
_parts: dict[str, Any] = {}
_previous_handlers: dict[int, Any] = {}
_previous_excepthook: Any = None
_fork_handler_registered = False


def configure(config: RecordConfig | None) -> None:
    global _config
    _config = config


def active_recorder() -> Recorder | None:
    """This process's recorder from start to stop, also after a fault cleared ``state.recorder``: its log and
    Flight Recorder dumps outlive the patch layer."""
    return _parts.get("recorder")


def on_default_group(pg: Any) -> None:
    """Called right after torch creates the default process group."""
    if state.recorder is not None:
        rec = active_recorder()  # the same recorder: start() sets both
        if rec is not None:
            rec.default_group = pg  # the job re-created its default group
        return
    if _config is None:
        return
    try:
        start(_config, pg)
    except Exception as exc:
        print(f"comm2perfetto: recording not started in pid {os.getpid()}: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)


# --- the hooks the patch layer puts around c10d's own functions (bootstrap.py hands them over) ----------------

def _default_group_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``_update_default_pg``: every way of creating the default group (init_process_group,
    init_device_mesh, elastic re-init) goes through it, so recording starts right after."""

    @functools.wraps(original)
    def update_default_pg(pg: Any) -> Any:
        result = original(pg)
        if pg is not None:
            on_default_group(pg)
        return result

    return update_default_pg


def _destroy_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    """Dump Flight Recorder before the default group goes away (its entries may go with it)."""

    @functools.wraps(original)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        rec = active_recorder()  # also after a fault disabled the wrappers: FR dumps go on
        group = args[0] if args else kwargs.get("group")
        if rec is not None and group is None:
            rec.dump_flight_recorder("destroy")
        return original(*args, **kwargs)

    return destroy_process_group


def _new_group_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``_new_process_group_helper``, which creates every process group (``new_group``, device meshes,
    the default group): a gloo group made while recording may need the dispatcher fallback."""

    @functools.wraps(original)
    def new_process_group_helper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)  # (pg, prefix_store) on 2.4 to 2.13
        if _parts.get("fallback") is False:  # wanted on this torch, not installed yet
            _consider_fallback(result[0] if isinstance(result, tuple) else result)
        return result

    return new_process_group_helper


# c10d's function -> the hook that replaces it.
HOOKS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "_update_default_pg": _default_group_hook,
    "destroy_process_group": _destroy_hook,
    "_new_process_group_helper": _new_group_hook,
}


def _consider_fallback(pg: Any) -> None:
    """Install the dispatcher fallback (dispatch.py) once a group of the job uses gloo, where this torch's
    Flight Recorder does not record gloo (mechanisms.py): ``_parts["fallback"]`` goes from False (wanted) to
    True (installed)."""
    import torch.distributed.distributed_c10d as c10d

    from comm2perfetto.record import dispatch
    from comm2perfetto.record.recorder import dispatcher_kernel

    rec = active_recorder()
    try:
        uses_gloo = isinstance(pg, c10d.ProcessGroup) and "gloo" in str(c10d.get_backend_config(pg))
    except Exception:  # a group destroyed meanwhile
        uses_gloo = False
    if rec is None or not uses_gloo:
        return
    try:
        dispatch.install(dispatcher_kernel)
        _parts["fallback"] = True
    except Exception as exc:
        _parts.pop("fallback", None)
        rec.warn(f"the dispatcher fallback could not be installed, so collectives issued from C++ on gloo (DDP's, "
                 f"FSDP's) are not recorded: {type(exc).__name__}: {exc}")


def start(config: RecordConfig, pg: Any) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from comm2perfetto._version import __version__
    from comm2perfetto.record.profiler import ProfilerCapture
    from comm2perfetto.record.recorder import Recorder
    from comm2perfetto.record.watchdog import Watchdog

    unsupported = unsupported_torch(torch.__version__)  # the launcher checked its own torch; a rank may run another
    if unsupported is not None:
        raise RuntimeError(unsupported)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # Under torchrun's restarts each attempt writes into a folder of its own (layout.attempt_dir).
    attempt = layout.restart_count(os.environ)
    out_dir = layout.attempt_dir(config.out_dir, attempt)
    os.makedirs(out_dir, exist_ok=True)
    if out_dir != config.out_dir:
        follow_attempt(os.environ, config.out_dir, out_dir)
    log = EventLog(os.path.join(out_dir, layout.event_log(rank)))
    log.write({
        "kind": "header", "format": "comm2perfetto-events", "version": 1,
        "rank": rank, "world_size": world_size, "local_rank": _int_env("LOCAL_RANK"),
        "host": socket.gethostname(), "pid": os.getpid(), "torch": torch.__version__,
        "backend": str(dist.get_backend()), "comm2perfetto": __version__, "run_id": config.run_id,
        "torchelastic_run_id": os.environ.get("TORCHELASTIC_RUN_ID"), "master": _master_endpoint(),
        "attempt": attempt, "max_restarts": _int_env(layout.MAX_RESTARTS_ENV),
        "wall_ns": time.time_ns(), "mono_ns": time.monotonic_ns(), "argv": sys.argv,
        "config": config.as_header(), "cpp_collectives": mechanisms(torch.__version__),
    })
    rec = Recorder(config, log, rank, world_size)
    rec.default_group = pg
    rec.declare_group(pg)
    rec.flight = FlightRecorderDumps(rec, out_dir, config.fr_buffer)
    rec.steps.install()
    capture.install(torch)
    rec.steps.listeners.append(rec.flight.at_step)
    if rec.modules is not None:
        rec.modules.install()
        rec.steps.listeners.append(rec.check_module_tracking)
    profiler = ProfilerCapture(rec, out_dir, config.profile_steps)
    _parts["profiler"] = profiler

    try:
        store = c10d._get_default_store()
        if attempt:  # torchrun's store outlives an attempt: keep a restarted attempt's keys apart
            store = dist.PrefixStore(f"attempt{attempt}", store)
    except Exception:
        store = None
        rec.warn("no c10d store: clock offsets and job-wide stall dumps are off on this rank")
    _parts["recorder"] = rec
    state.recorder = rec
    if gloo_fallback_wanted(torch.__version__):
        _parts["fallback"] = False
        _consider_fallback(pg)
    profiler.install()
    if store is not None:
        _parts["clock"] = clock.start(store, rank, world_size, functools.partial(_clock_measured, rec))
    live = None
    if store is not None and config.live and config.stall_after_s is not None:
        from comm2perfetto.record.live import LiveVerdict

        live = LiveVerdict(rec, store, out_dir, world_size, _int_env("LOCAL_RANK"))
    windows = None
    if config.live_every_s is not None:
        from comm2perfetto.record.gather import WindowExchange
        from comm2perfetto.record.window import WindowSummaries

        exchange = None
        if store is not None:
            exchange = WindowExchange(rec, store, world_size, config.live_every_s, config.out_dir,
                                      socket.gethostname(), attempt)
        windows = WindowSummaries(rec, config.live_every_s, exchange, config.out_dir)
    watchdog = Watchdog(rec, store, config.stall_after_s, out_dir, live=live, windows=windows)
    watchdog.start()
    _parts["watchdog"] = watchdog
    _install_exit_handlers()


def stop(reason: str, wait: bool = True) -> None:
    """Dump Flight Recorder, close the log and remove every hook. Safe to call twice."""
    # The recorder, also after a fault disabled its patch layer: its log and Flight Recorder still close.
    rec = _parts.pop("recorder", None)
    # First the recorder's threads: none may be left inside a store call when the interpreter finalises.
    for name in ("clock", "watchdog"):
        thread = _parts.pop(name, None)
        if thread is not None:
            thread.stop(wait)
    profiler = _parts.pop("profiler", None)
    if _parts.pop("fallback", None):
        from comm2perfetto.record import dispatch

        dispatch.uninstall()
    if rec is None:
        return
    try:
        if profiler is not None:
            profiler.uninstall()
        rec.dump_flight_recorder(reason, wait)
        rec.steps.uninstall()
        capture.uninstall()
        if rec.modules is not None:
            rec.modules.uninstall()
    except Exception as exc:
        rec.warn(f"while stopping: {type(exc).__name__}: {exc}")
    state.recorder = None
    rec.log.write(["z", time.time_ns(), time.monotonic_ns(), reason])
    rec.log.close()
    rec.release_groups()


def _clock_measured(rec: Recorder, offset_ns: int, rtt_ns: int) -> None:
    """The clock measurement's result (on its thread): into the log, and for the window summaries."""
    rec.clock = (offset_ns, rtt_ns)
    rec.log.write(["o", offset_ns, rtt_ns])


def _master_endpoint() -> str | None:
    """``MASTER_ADDR:MASTER_PORT``, what every rank of one job (on every node) was told to rendezvous at."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    return f"{addr}:{port}" if addr and port else None


def _int_env(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value and value.isdigit() else None


# --- exits, crashes, signals, forks ---------------------------------------------------------------------------

def _install_exit_handlers() -> None:
    global _previous_excepthook, _fork_handler_registered
    atexit.register(_at_exit)
    if _previous_excepthook is None:
        _previous_excepthook = sys.excepthook
        sys.excepthook = _on_uncaught
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(signum)
            if previous is _on_signal or not callable(previous):
                # Ignored (a shell's background job: SIGINT): it goes on ignoring it. The default action (SIGTERM's):
                # the process dies at once, even blocked in a C++ collective, where a Python handler would not
                # run until SIGKILL (torchrun's 30 s grace after a failure): a handler here would change when the
                # job ends, so the rank dies as it would have, and its log stays unclosed (read as killed).
                continue
            _previous_handlers[signum] = previous
            signal.signal(signum, _on_signal)
    if not _fork_handler_registered:
        os.register_at_fork(after_in_child=_forget_in_child)
        _fork_handler_registered = True


def remove_exit_handlers() -> None:
    global _previous_excepthook
    atexit.unregister(_at_exit)
    if _previous_excepthook is not None:
        sys.excepthook = _previous_excepthook
        _previous_excepthook = None
    if threading.current_thread() is threading.main_thread():
        for signum, previous in _previous_handlers.items():
            signal.signal(signum, previous)
    _previous_handlers.clear()


def _at_exit() -> None:
    stop("exit")


def _on_uncaught(exc_type: Any, exc: Any, tb: Any) -> None:
    rec = _parts.get("recorder")
    if rec is not None:
        try:
            rec.uncaught = True
            rec.log.write(["u", time.time_ns(), "exception", f"{exc_type.__name__}: {exc}"[:500]])
            rec.dump_flight_recorder("exception")
        except Exception:
            pass
    (_previous_excepthook or sys.__excepthook__)(exc_type, exc, tb)


def _on_signal(signum: int, frame: Any) -> None:
    """Chained before a Python handler the job has (the default SIGINT handler raises KeyboardInterrupt): the
    log says which signal ended the rank, and Flight Recorder is dumped, then the job's own handler runs."""
    rec = _parts.get("recorder")
    if rec is not None:
        try:
            rec.log.write(["u", time.time_ns(), "signal", signal.Signals(signum).name])
            rec.dump_flight_recorder("signal", wait=False)
        except Exception:
            pass
    _previous_handlers[signum](signum, frame)


def _forget_in_child() -> None:
    rec = state.recorder
    state.recorder = None
    _parts.clear()
    if rec is not None:
        rec.log.abandon()
