"""NVTX ranges: ``comm2perfetto.range()`` and mirroring of ranges that user code opens with ``nvtx`` or
``torch.cuda.nvtx``.

Every range is both emitted through NVTX (so Nsight Systems shows it) and written to the event log as an
``r``/``q`` record pair. The open ranges of each thread are also kept as a tuple of names
(``state.ThreadState.names``), which the patch layer stores with every collective (its "enclosing NVTX
ranges").

Without an NVTX collector attached the ``nvtx`` package hands out a dummy domain and never reaches its C
library, so mirroring patches its Python functions (``push_range``, ``pop_range``, ``annotate``, ``mark``),
not the library.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from comm2perfetto.record import state

F = TypeVar("F", bound=Callable[..., Any])

_range_ids = itertools.count(1)

DEFAULT_DOMAIN = "NVTX"
# The recorder's own ranges (``c10d:all_reduce`` around each recorded call) go to a domain of their own, so an
# Nsight Systems user can show or hide them apart from the job's ranges.
OWN_DOMAIN = "comm2perfetto"
OWN_CATEGORY = "collective"


def begin(name: str, source: str, domain: str | None = None) -> None:
    """Record that ``name`` opened on this thread, in NVTX ``domain`` (no-op when not recording)."""
    rec = state.recorder
    if rec is None:
        return
    try:
        rid = next(_range_ids)
        t = time.time_ns()
        thread = state.threads.state
        domain = _domain_key(domain)
        thread.ids += (rid,)
        thread.names += (name,)
        thread.domains += (domain,)
        record = ["r", rid, t, name, thread.tid, source]
        if domain is not None:
            record.append(domain)
        rec.log.write(record)
    except Exception as exc:  # never let recording break the caller
        rec.fault(exc)


def end(domain: str | None = None) -> None:
    """Record that this thread's innermost recorded range of NVTX ``domain`` closed."""
    rec = state.recorder
    if rec is None:
        return
    thread = state.threads.state
    domains = thread.domains
    domain = _domain_key(domain)
    i = len(domains) - 1
    while i >= 0 and domains[i] != domain:
        i -= 1
    if i < 0:
        return
    try:
        rid = thread.ids[i]
        thread.ids = thread.ids[:i] + thread.ids[i + 1:]
        thread.names = thread.names[:i] + thread.names[i + 1:]
        thread.domains = domains[:i] + domains[i + 1:]
        rec.log.write(["q", rid, time.time_ns()])
    except Exception as exc:
        rec.fault(exc)


def _domain_key(domain: str | None) -> str | None:
    """NVTX's default domain is None or "NVTX" (the name ``nvtx.get_domain(None)`` gives it)."""
    return None if domain in (None, "", DEFAULT_DOMAIN) else domain


def mark(name: str, source: str) -> None:
    rec = state.recorder
    if rec is None:
        return
    try:
        rec.log.write(["m", time.time_ns(), name, threading.get_ident(), source])
    except Exception as exc:
        rec.fault(exc)


# The nvtx package's own functions, captured before mirroring replaces them; used to emit our ranges.
_nvtx_push: Callable[..., Any] | None = None
_nvtx_pop: Callable[..., Any] | None = None


def _load_nvtx() -> None:
    global _nvtx_push, _nvtx_pop
    if _nvtx_push is not None:
        return
    try:
        import nvtx
    except ImportError:  # nvtx is a dependency, but a broken install must not stop training
        _nvtx_push = _nvtx_pop = _noop
        return
    _nvtx_push = getattr(nvtx.push_range, "__c2p_original__", nvtx.push_range)
    _nvtx_pop = getattr(nvtx.pop_range, "__c2p_original__", nvtx.pop_range)


def _noop(*_args: Any, **_kwargs: Any) -> None:
    return None


def collector_attached() -> bool:
    """True when an NVTX tool (Nsight Systems) is attached; without one, emitting ranges is wasted time."""
    try:
        import nvtx
        import nvtx.nvtx as impl
    except ImportError:
        return False
    return nvtx.get_domain(None) is not impl.dummy_domain


def emit_push(name: str, domain: str | None = None, category: str | None = None) -> None:
    _load_nvtx()
    _nvtx_push(name, domain=domain, category=category)  # type: ignore[misc]


def emit_pop(domain: str | None = None) -> None:
    _nvtx_pop(domain=domain)  # type: ignore[misc]


def emit_own_push(call_name: str) -> None:
    """The recorder's range around a recorded call, in its own domain."""
    emit_push("c10d:" + call_name, OWN_DOMAIN, OWN_CATEGORY)


def emit_own_pop() -> None:
    emit_pop(OWN_DOMAIN)


class range:
    """An NVTX range that comm2perfetto records too. Context manager and decorator::

        with range("data loading"):
            batch = next(batches)

        @range("optimizer")
        def apply(): ...
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> range:
        emit_push(self.name)
        begin(self.name, "c2p")
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        end()
        emit_pop()
        return False

    def __call__(self, func: F) -> F:
        name = self.name

        @functools.wraps(func)
        def inner(*args: Any, **kwargs: Any) -> Any:
            with range(name):
                return func(*args, **kwargs)

        return inner  # type: ignore[return-value]


# --- mirroring of ranges opened by other code -------------------------------------------------------------

_patched: list[tuple[Any, str, Any]] = []  # (owner, attribute, original) for uninstall


def _replace(owner: Any, attr: str, new: Any) -> None:
    original = getattr(owner, attr)
    if getattr(original, "__c2p_original__", None) is not None:
        return  # already ours
    new.__c2p_original__ = original
    setattr(owner, attr, new)
    _patched.append((owner, attr, original))


def mirror_nvtx_package(nvtx_module: Any) -> None:
    """Patch the ``nvtx`` package's range functions so the ranges they open are recorded."""
    import nvtx.nvtx as impl

    _load_nvtx()
    push_orig, pop_orig = impl.push_range, impl.pop_range
    mark_orig = impl.mark

    def push_range(message: str | None = None, color: Any = "blue", domain: str | None = None,
                   *args: Any, **kwargs: Any) -> Any:
        result = push_orig(message, color, domain, *args, **kwargs)
        begin(message or "", "nvtx", domain)
        return result

    def pop_range(domain: str | None = None) -> Any:
        result = pop_orig(domain)
        end(domain)
        return result

    def mark_(message: str | None = None, *args: Any, **kwargs: Any) -> Any:
        result = mark_orig(message, *args, **kwargs)
        mark(message or "", "nvtx")
        return result

    for owner in {id(nvtx_module): nvtx_module, id(impl): impl}.values():
        _replace(owner, "push_range", functools.wraps(push_orig)(push_range))
        _replace(owner, "pop_range", functools.wraps(pop_orig)(pop_range))
        _replace(owner, "mark", functools.wraps(mark_orig)(mark_))

    annotate = impl.annotate
    enter_orig, exit_orig, call_orig = annotate.__enter__, annotate.__exit__, annotate.__call__

    def __enter__(self: Any) -> Any:
        result = enter_orig(self)
        begin(self.init_args[0] or "", "nvtx", self.init_args[2])
        return result

    def __exit__(self: Any, *exc: Any) -> Any:
        end(self.init_args[2])
        return exit_orig(self, *exc)

    def __call__(self: Any, func: Callable[..., Any]) -> Any:
        inner = call_orig(self, func)
        name = self.init_args[0] or getattr(func, "__name__", "")
        domain = self.init_args[2]

        @functools.wraps(func)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            begin(name, "nvtx", domain)
            try:
                return inner(*args, **kwargs)
            finally:
                end(domain)

        return recorded

    _replace(annotate, "__enter__", __enter__)
    _replace(annotate, "__exit__", __exit__)
    _replace(annotate, "__call__", __call__)


class _TorchNvtxProxy:
    """Stands in for ``torch.cuda.nvtx._nvtx``: calls the real library first (which raises on CPU-only
    builds, as it would without us), then records what succeeded."""

    def __init__(self, inner: Any) -> None:
        self.__c2p_original__ = inner

    def rangePushA(self, message: str) -> Any:
        result = self.__c2p_original__.rangePushA(message)
        begin(message, "torch.cuda.nvtx")
        return result

    def rangePop(self) -> Any:
        result = self.__c2p_original__.rangePop()
        end()
        return result

    def markA(self, message: str) -> Any:
        result = self.__c2p_original__.markA(message)
        mark(message, "torch.cuda.nvtx")
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__c2p_original__, name)


def mirror_torch_cuda_nvtx(module: Any) -> None:
    inner = module._nvtx
    if isinstance(inner, _TorchNvtxProxy):
        return
    _patched.append((module, "_nvtx", inner))
    module._nvtx = _TorchNvtxProxy(inner)


def unmirror_all() -> None:
    while _patched:
        owner, attr, original = _patched.pop()
        setattr(owner, attr, original)
