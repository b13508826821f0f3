"""Where in the training loop a call happens: the step number and the enclosing nn.Module.

Steps are found without code changes: each ``optimizer.step()`` ends a step (a global optimizer hook), as
does each ``torch.profiler.profile.step()``. The first automatic source that fires is the one used, so a
loop with both does not count twice; ``comm2perfetto.step()`` overrides both once called.

Modules come from global forward hooks that keep a per-thread stack of the modules being run, each with its
dotted path (``DistributedDataParallel.module.seq.0``), and from a log of the module calls that ended, which
attributes a collective in backward to a module without any backward hook (ModuleTracker).
"""

from __future__ import annotations

import bisect
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from comm2perfetto.record import state

if TYPE_CHECKING:
    from comm2perfetto.record.view import RankLog


class StepCounter:
    def __init__(self, recorder: RankLog) -> None:
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
        for listener in self.listeners[:]:  # a listener may remove itself
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


# Module calls kept for backward attribution: a backward looks up the forward passes before it. Older calls are
# dropped once twice this many accumulate (a forward pass of more module calls loses its first ones).
_KEEP_CALLS = 1 << 15


def _path_of(thread: state.ThreadState, q: int) -> str | None:
    """The path of the module call on ``thread`` with the smallest end at or above autograd sequence number
    ``q``, within the outermost call that created node ``q``; None outside every outermost call."""
    i = bisect.bisect_right(thread.root_starts, q) - 1
    if i < 0:
        return None
    end, lo, hi = thread.roots[i]
    if q > end:  # created after the outermost module returned (a loss computed outside any module)
        return None
    return thread.paths[bisect.bisect_left(thread.ends, q, lo, hi)]


def _forget_oldest(thread: state.ThreadState) -> None:
    """Drop whole outermost calls, oldest first, keeping the last ``_KEEP_CALLS`` module calls (or the last
    outermost call, if it alone has more)."""
    cut = len(thread.ends) - _KEEP_CALLS
    k = 0
    while k < len(thread.roots) - 1 and thread.roots[k][2] <= cut:
        k += 1
    offset = thread.roots[k][1]
    del thread.ends[:offset]
    del thread.paths[:offset]
    thread.roots = [(end, lo - offset, hi - offset) for end, lo, hi in thread.roots[k:]]
    thread.root_starts = thread.root_starts[k:]


class ModuleTracker:
    """The nn.Module a collective is issued in, attributed as torch's CommDebugMode does.

    Forward: a per-thread stack of running modules with their paths (``state.ThreadState.stack``), kept by
    global forward hooks. A module stays on it until its own forward hooks ran (TP's RowwiseParallel
    all-reduces its output in one): modules with local forward hooks get a local hook of ours, kept last, that
    ends the call; the others end in the global post hook.

    Backward: the module whose backward began last (where CommDebugMode's backward pre hook fires), found
    without adding anything to the autograd graph. Each module call logs, when it ends, the last autograd
    sequence number created so far. The engine runs a backward's nodes from high to low sequence number and a
    module's backward begins above its last node, so the module whose backward began last before node ``q``
    ran is the call with the smallest logged number at or above ``q`` (the innermost on ties: calls are logged
    in the order they end). A collective in backward looks that up for the running node
    (``torch._C._current_autograd_node()``).
    """

    def __init__(self, on_error: Callable[[BaseException], None]) -> None:
        self._on_error = on_error
        # id(module) -> (its caller's path, its path), as last called: ``Net.seq.0``
        self._paths: dict[int, tuple[str | None, str]] = {}
        self._handles: list[Any] = []
        self._local: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # module -> our hook
        self._last_forward: state.ThreadState | None = None  # the thread that ran the latest forward pass
        self._current_node: Callable[[], Any] = lambda: None

    def install(self) -> None:
        import torch
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        sequence_nr = torch._C._autograd._get_sequence_nr
        graph_task = torch._C._current_graph_task_id
        self._current_node = torch._C._current_autograd_node
        threads = state.threads
        local = self._local
        known = self._paths

        def pre(module: Any, _inputs: Any) -> None:
            thread = threads.state
            stack = thread.stack
            if stack:
                known_as = known.get(id(module))
                caller = stack[-1]
                if known_as is None or known_as[0] is not caller[1]:
                    known_as = self._new_path(caller, module)
                stack.append((module, known_as[1]))
            else:
                thread.root_start = sequence_nr()
                known_as = known.get(id(module))
                if graph_task() == -1:
                    self._last_forward = thread
                    if known_as is None or known_as[0] is not None:
                        known_as = self._new_path(None, module)
                    stack.append((module, known_as[1]))
                else:  # recomputed in backward (activation checkpointing): the path it had in forward
                    stack.append((module, known_as[1] if known_as else type(module).__name__))
            if module._forward_hooks:
                self._end_after_local_hooks(module)

        def post(module: Any, _inputs: Any, _output: Any, last_hook: bool = False) -> None:
            if not last_hook and module._forward_hooks:
                handle = local.get(module)
                if handle is not None and handle.id in module._forward_hooks:
                    return  # our local hook, the module's last, ends the call
            thread = threads.state
            stack = thread.stack
            if not stack:
                return
            thread.ends.append(sequence_nr() - 1)
            thread.paths.append(stack.pop()[1])
            if not stack:  # the outermost call ended
                thread.root_starts.append(thread.root_start)
                thread.roots.append((thread.ends[-1], thread.roots[-1][2] if thread.roots else 0, len(thread.ends)))
                if len(thread.ends) > 2 * _KEEP_CALLS:
                    _forget_oldest(thread)

        def local_end(module: Any, inputs: Any, output: Any) -> None:
            post(module, inputs, output, last_hook=True)

        self._local_end = local_end
        self._handles = [
            register_module_forward_pre_hook(pre),
            register_module_forward_hook(post, always_call=True),
        ]

    def _end_after_local_hooks(self, module: Any) -> None:
        """Make our local hook the last of ``module``'s forward hooks, so its call ends after theirs."""
        try:
            handle = self._local.get(module)
            if handle is not None:
                if next(reversed(module._forward_hooks)) == handle.id:
                    return
                handle.remove()
            self._local[module] = module.register_forward_hook(self._local_end, always_call=True)
        except Exception as exc:
            self._on_error(exc)

    def uninstall(self) -> None:
        for handle in [*self._handles, *self._local.values()]:
            handle.remove()
        self._handles.clear()
        self._local.clear()
        self._last_forward = None
        for ref in state.all_threads.valuerefs():  # a module running now would never leave its stack
            thread = ref()
            if thread is not None:
                thread.stack.clear()
                for log in (thread.ends, thread.paths, thread.root_starts, thread.roots):
                    log.clear()

    # --- at a recorded call ---------------------------------------------------------------------------------

    def backward_path(self) -> str | None:
        """Path of the module whose backward began last before the running autograd node, or None."""
        thread = self._last_forward
        node = self._current_node()
        if thread is None or node is None:
            return None
        return _path_of(thread, node._sequence_nr())

    def _new_path(self, caller: tuple[Any, str] | None, module: Any) -> tuple[str | None, str]:
        """``(caller's path, path)`` of ``module`` called by ``caller`` (that module and its path, or None):
        ``Net.seq.0``, the outermost module's class name, then each module's name in the one that called it."""
        if caller is None:
            path = type(module).__name__
        else:
            parent, parent_path = caller
            try:
                name = next((n for n, m in parent.named_modules() if m is module and n), None)
            except Exception:  # a module's own named_modules() failing must not fail its caller's forward
                name = None
            path = f"{parent_path}.{name or type(module).__name__}"
        known_as = self._paths[id(module)] = (caller[1] if caller else None, path)
        return known_as
