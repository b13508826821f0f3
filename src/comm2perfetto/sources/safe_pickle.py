"""Unpickling that cannot run code: Flight Recorder dumps come from other machines.

A pickle is a small program; ``pickle.loads`` will import and call whatever a ``GLOBAL``/``STACK_GLOBAL``
opcode names (``os.system`` via ``__reduce__``). Flight Recorder dumps hold only dict, list, tuple, str,
int, float, bool and None (FACTS.md), none of which needs a global, so ``find_class`` refuses every name
except torch's typed-list helpers, which it answers with stand-ins of its own that only build a list.
``pickle.Unpickler`` is the C implementation; overriding ``find_class`` keeps it C-fast because the hook
only runs for the opcodes we refuse.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from comm2perfetto.errors import Comm2PerfettoError

__all__ = ["UnsafePickleError", "looks_like_pickle", "safe_loads"]


class UnsafePickleError(Comm2PerfettoError, pickle.UnpicklingError):
    """The pickle asked for a class or function: refused."""


def _as_list(items: Any) -> list:
    return list(items)


def _keep(value: Any, *_type_tag: Any) -> Any:
    return value


# torch's C++ pickler wraps *typed* lists and dicts in calls to these helpers. Flight Recorder builds untyped
# ones, but if a build ever tags them, we answer with our own harmless stand-ins (torch is never imported).
_PLAIN_DATA_HELPERS = {
    ("torch.jit._pickle", "build_intlist"): _as_list,
    ("torch.jit._pickle", "build_doublelist"): _as_list,
    ("torch.jit._pickle", "build_boollist"): _as_list,
    ("torch.jit._pickle", "build_list"): _as_list,
    ("torch.jit._pickle", "restore_type_tag"): _keep,
}


class _NoGlobalsUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        helper = _PLAIN_DATA_HELPERS.get((module, name))
        if helper is not None:
            return helper
        raise UnsafePickleError(
            f"refused to load {module}.{name}: a Flight Recorder dump holds only plain data, "
            "so this file was made by something else (possibly to run code)"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError("refused a persistent id: not plain data")


def safe_loads(data: bytes) -> Any:
    """``pickle.loads`` for plain data only. Raises UnsafePickleError, pickle.UnpicklingError, EOFError,
    ValueError... on anything else (callers treat every exception as "not a readable dump")."""
    # A BufferedReader, not a bare BytesIO: the C unpickler prefetches through peek(), which BytesIO lacks;
    # without it every opcode becomes a read() call and loading is three times slower (measured).
    return _NoGlobalsUnpickler(io.BufferedReader(io.BytesIO(data), buffer_size=max(len(data), 1))).load()


def looks_like_pickle(head: bytes) -> bool:
    """Protocol 2+ pickles start with PROTO (0x80) and the protocol number; torch's C++ pickler writes 2."""
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5
