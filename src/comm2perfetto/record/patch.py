"""The patch layer: puts wrappers in place of every public ``torch.distributed`` collective and p2p call (the
ops of ops.py), and of the functional collectives DTensor uses, and takes them off again.

``install()`` replaces each function in ``torch.distributed.distributed_c10d`` and in ``torch.distributed``
with a wrapper, ``install_functional()`` each one in ``torch.distributed._functional_collectives``;
``uninstall()`` puts the originals back. All are idempotent. What a wrapper does is not decided here: the
installer hands over the wrapper factory and the hooks (bootstrap.py: recorder.recording_wrapper, and
session's hooks that start recording when the default group appears and dump Flight Recorder before it is
destroyed), so this module knows torch's functions and nothing of the recorder.

Patching happens when ``torch.distributed.distributed_c10d`` finishes importing (see bootstrap.py), before
``torch.distributed`` copies the names into its namespace and before user modules run
``from torch.distributed import all_reduce``; so those see the wrappers too. The functional collectives are
patched when their module finishes importing; DTensor calls them as ``funcol.all_reduce(...)``. What never
passes through these functions (DDP's and FSDP1's collectives, issued from C++; the backward of a functional
collective called outside DTensor, run by autograd) is covered by Flight Recorder instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from comm2perfetto.record.ops import FUNCTIONAL_OPS, OPS, BoundSpec, OpSpec, bind

# What replaces torch's function for one op: (the op bound to that function, the function) -> the wrapper.
WrapperFactory = Callable[[BoundSpec, Callable[..., Any]], Callable[..., Any]]
# What replaces one other function of c10d (a hook around it): the function -> its replacement.
HookFactory = Callable[[Callable[..., Any]], Callable[..., Any]]

# (module, name, torch's function) for each replacement, in order: what uninstall() puts back.
_replaced: list[tuple[Any, str, Any]] = []


def _make_wrapper(wrap: WrapperFactory, spec: OpSpec, original: Callable[..., Any],
                  tracing: Callable[[], bool] | None = None) -> Callable[..., Any]:
    return wrap(bind(spec, original, tracing), original)


def _replace(module: Any, name: str, factory: HookFactory) -> None:
    original = getattr(module, name, None)
    if original is None or hasattr(original, "__c2p_original__"):
        return  # an older torch without this function, or wrapped already
    replacement: Any = factory(original)
    replacement.__c2p_original__ = original  # how install() and uninstall() know a function as ours
    setattr(module, name, replacement)
    _replaced.append((module, name, original))


def install(c10d: Any, dist: Any | None = None, *, wrap: WrapperFactory,
            hooks: Mapping[str, HookFactory] | None = None) -> None:
    """Wrap every op of ``OPS`` in ``c10d`` (``torch.distributed.distributed_c10d``) with ``wrap(bound op,
    torch's function)``, replace each function named in ``hooks`` with ``hooks[name](torch's function)``, and,
    when ``dist`` (``torch.distributed``) is given, put the same replacements there. Idempotent."""
    hooks = hooks or {}
    for spec in OPS:
        _replace(c10d, spec.name, functools.partial(_make_wrapper, wrap, spec))
    for name, factory in hooks.items():
        _replace(c10d, name, factory)
    if dist is None:
        return
    for name in [spec.name for spec in OPS] + list(hooks):
        wrapper = getattr(c10d, name, None)
        original = getattr(wrapper, "__c2p_original__", None)
        if original is not None and getattr(dist, name, None) is original:
            setattr(dist, name, wrapper)
            _replaced.append((dist, name, original))


def install_functional(funcol: Any, *, wrap: WrapperFactory, hooks: Mapping[str, HookFactory] | None = None) -> None:
    """Wrap every op of ``FUNCTIONAL_OPS`` in ``torch.distributed._functional_collectives`` with ``wrap``, and
    replace each function named in ``hooks`` (``wait_tensor``) with ``hooks[name](torch's function)``.
    Idempotent."""
    tracing = getattr(funcol, "_are_we_tracing", None)
    for spec in FUNCTIONAL_OPS:
        _replace(funcol, spec.name, functools.partial(_make_wrapper, wrap, spec, tracing=tracing))
    for name, factory in (hooks or {}).items():
        _replace(funcol, name, factory)


def uninstall() -> None:
    """Put every original function back where a wrapper was installed (unless someone replaced our wrapper
    since). Idempotent."""
    while _replaced:
        module, name, original = _replaced.pop()
        if getattr(getattr(module, name, None), "__c2p_original__", None) is original:
            setattr(module, name, original)


def installed() -> bool:
    return bool(_replaced)
