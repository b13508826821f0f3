"""Getting into every rank process without editing the training script.

``comm2perfetto record`` puts ``record/_boot`` first on ``PYTHONPATH``; its ``sitecustomize.py`` runs at the
start of every Python process of the job (torchrun's agent, each rank, DataLoader workers) and calls
``activate_from_env()``. That costs one small import and imports no torch: it only registers import hooks.
Torch is patched when ``torch.distributed.distributed_c10d`` finishes importing, and recording starts when
the default process group is created, so processes that never join a job are left alone.

This is also where the patch layer is put together (``install_patches``): patch.py wraps the functions of
ops.py with what it is handed, recorder.py's wrapper and session.py's hooks.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from comm2perfetto.record.config import RecordConfig


def install_patches(c10d: ModuleType, dist: ModuleType | None = None) -> None:
    """The patch layer over ``torch.distributed.distributed_c10d`` (and ``torch.distributed``, when given), put
    together here: the recorder's wrapper around each op, the session's hooks around the default group's
    creation and destruction. Idempotent; ``patch.uninstall()`` takes it off."""
    from comm2perfetto.record import patch, session
    from comm2perfetto.record.recorder import recording_wrapper

    patch.install(c10d, dist, wrap=recording_wrapper, hooks=session.HOOKS)


def install_functional_patches(funcol: ModuleType) -> None:
    """The recorder's wrapper around each functional collective (``torch.distributed._functional_collectives``),
    and around ``wait_tensor``, whose return times those on CPU tensors."""
    from comm2perfetto.record import patch
    from comm2perfetto.record.recorder import recording_wrapper, wait_wrapper

    patch.install_functional(funcol, wrap=recording_wrapper, hooks={"wait_tensor": wait_wrapper})


def _patch_c10d(module: ModuleType) -> None:
    install_patches(module, sys.modules.get("torch.distributed"))


def _mirror_nvtx(module: ModuleType) -> None:
    from comm2perfetto.record import nvtx

    nvtx.mirror_nvtx_package(module)


def _mirror_torch_cuda_nvtx(module: ModuleType) -> None:
    from comm2perfetto.record import nvtx

    nvtx.mirror_torch_cuda_nvtx(module)


# Module name -> what to do right after it has been executed.
POST_IMPORT: dict[str, Callable[[ModuleType], None]] = {
    "torch.distributed.distributed_c10d": _patch_c10d,
    "torch.distributed._functional_collectives": install_functional_patches,
    "nvtx": _mirror_nvtx,
    "torch.cuda.nvtx": _mirror_torch_cuda_nvtx,
}


class _LoaderWithCallback(importlib.abc.Loader):
    def __init__(self, loader: Any, callback: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._callback = callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        try:
            self._callback(module)
        except Exception as exc:  # never break the user's import
            print(f"comm2perfetto: could not instrument {module.__name__}: {exc}", file=sys.stderr)

    def __getattr__(self, name: str) -> Any:  # get_code, get_source, is_package ... for tools that ask
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the other finders, then wraps the loader of the modules we care about."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        callback = POST_IMPORT.get(name)
        if callback is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _LoaderWithCallback(spec.loader, callback)
                return spec
        return None


_finder = _PostImportFinder()


def install_hooks() -> None:
    """Instrument the modules of ``POST_IMPORT``: those already imported now, the others when they are."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    for name, callback in POST_IMPORT.items():
        module = sys.modules.get(name)
        if module is not None:
            callback(module)


def remove_hooks() -> None:
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def activate_from_env() -> None:
    """Called by the injected sitecustomize: start recording if the launcher asked for it."""
    config = RecordConfig.from_env()
    if config is None:
        return
    from comm2perfetto.record import session

    session.configure(config)
    install_hooks()
