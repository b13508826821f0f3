"""Where in the training loop a call happens: the step number and the enclosing nn.Module.

Steps are found without code changes: each ``optimizer.step()`` ends a step (a global optimizer hook), as
does each ``torch.profiler.profile.step()``. The first automatic source that fires is the one used, so a
loop with both does not count twice; ``comm2perfetto.step()`` overrides both once called.

Modules come from global forward hooks that keep a per-thread stack of the modules being run; the dotted path
(``DistributedDataParallel.module.seq.0``) is computed only when a call is recorded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from comm2perfetto.record.recorder import Recorder


class StepCounter:
    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder
        self.current = 0
        self.source: str | None = None
        self._first_optimizer: int | None = None
        self.listeners: list[Callable[[int], None]] = []
        self._handles: list[Any] = []

    def advance(self, source: str) -> None:
        if source != "user" and self.source not in (None, source):
            return
        if source == "user" or self.source is None:
            self.source = source
        self.current += 1
        self._recorder.log.write(["p", self.current, time.time_ns(), source])
        for listener in self.listeners:
            listener(self.current)

    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        def after_optimizer_step(optimizer: Any, _args: Any, _kwargs: Any) -> None:
            # With several optimizers, the first one to step marks the step boundary.
            if self._first_optimizer is None:
                self._first_optimizer = id(optimizer)
            if id(optimizer) == self._first_optimizer:
                self._guarded(self.advance, "optimizer")

        self._handles.append(register_optimizer_step_post_hook(after_optimizer_step))

    def _guarded(self, fn: Callable[..., None], *args: Any) -> None:
        from comm2perfetto.record import state

        if state.recorder is not self._recorder:
            return
        try:
            fn(*args)
        except Exception as exc:
            self._recorder.fault(exc)

    def on_profiler_step(self) -> None:
        self._guarded(self.advance, "profiler")

    def uninstall(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


class _Stack(threading.local):
    modules: list[Any]

    def __init__(self) -> None:
        self.modules = []


class ModuleTracker:
    """Per-thread stack of running modules via global forward hooks (a few microseconds per module call)."""

    def __init__(self) -> None:
        self.stack = _Stack()
        self._names: dict[tuple[int, int], str] = {}
        self._handles: list[Any] = []

    def install(self) -> None:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        stack = self.stack

        def pre(module: Any, _inputs: Any) -> None:
            stack.modules.append(module)

        def post(_module: Any, _inputs: Any, _output: Any) -> None:
            if stack.modules:
                stack.modules.pop()

        self._handles = [
            register_module_forward_pre_hook(pre),
            register_module_forward_hook(post, always_call=True),
        ]

    def uninstall(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def current_path(self) -> str | None:
        modules = self.stack.modules
        if not modules:
            return None
        parts = [type(modules[0]).__name__]
        for parent, child in zip(modules, modules[1:]):
            parts.append(self._child_name(parent, child))
        return ".".join(parts)

    def _child_name(self, parent: Any, child: Any) -> str:
        key = (id(parent), id(child))
        name = self._names.get(key)
        if name is None:
            name = next((n for n, m in parent.named_modules() if m is child and n), None)
            name = name or type(child).__name__
            self._names[key] = name
        return name
