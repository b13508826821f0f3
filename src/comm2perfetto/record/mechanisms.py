"""Which source records what on a given torch: the torch versions the recorder runs on, and for each backend
the mechanism that sees the collectives issued from C++ (DDP's gradient all-reduces, its parameter broadcast
and shape check, FSDP's), which never pass the patch layer. Imports no torch (the launcher asks too).

- ``torch.distributed`` calls: the patch layer, on every torch and backend.
- NCCL: Flight Recorder, on every torch from 2.4 on.
- gloo: Flight Recorder from torch 2.8 on. Torch 2.4 to 2.7 have no Flight Recorder for gloo (only
  ``_dump_nccl_trace``; a gloo dump is ``{'entries': []}``), so there the recorder puts a kernel of its own on
  c10d's dispatcher ops (dispatch.py), installed only once a gloo group exists. ``COMM2PERFETTO_DISPATCH_FALLBACK``
  (tests and benchmarks only) forces it on any torch (``force``) or keeps it off (``off``).
"""

from __future__ import annotations

import os

from comm2perfetto.record.flight import _installed_torch, _release

# The oldest torch the recorder runs on (pyproject.toml's `record` extra says the same; run_matrix.sh checked it).
MIN_TORCH = (2, 4)
# The first torch whose Flight Recorder records gloo: before it, the dispatcher fallback covers gloo.
GLOO_FLIGHT_RECORDER = (2, 8)
ENV_FALLBACK = "COMM2PERFETTO_DISPATCH_FALLBACK"

FLIGHT_RECORDER = "Flight Recorder"
DISPATCHER = "the dispatcher fallback"


def unsupported_torch(version: str | None = None) -> str | None:
    """Why this torch cannot be recorded, in one line, or None. ``version`` defaults to the installed torch's
    (from its metadata: the launcher must not import torch); an unreadable version is given the benefit of
    the doubt.

    >>> unsupported_torch("2.3.1+cu121")
    "comm2perfetto record needs torch >= 2.4, found 2.3.1+cu121 (pip install 'torch>=2.4')"
    >>> unsupported_torch("2.4.1") is None and unsupported_torch("2.13.0+cpu") is None
    True
    """
    version = _installed_torch() if version is None else version
    release = _release(version)
    if release is None or release >= MIN_TORCH:
        return None
    least = f"{MIN_TORCH[0]}.{MIN_TORCH[1]}"
    return f"comm2perfetto record needs torch >= {least}, found {version} (pip install 'torch>={least}')"


def gloo_fallback_wanted(version: str | None = None, environ: dict[str, str] | os._Environ | None = None) -> bool:
    """Whether gloo's C++-issued collectives need the dispatcher fallback on this torch (older than 2.8), or the
    switch forces it either way.

    >>> gloo_fallback_wanted("2.6.0+cu124", {}), gloo_fallback_wanted("2.8.0", {})
    (True, False)
    >>> gloo_fallback_wanted("2.13.0+cpu", {"COMM2PERFETTO_DISPATCH_FALLBACK": "force"})
    True
    """
    switch = (os.environ if environ is None else environ).get(ENV_FALLBACK, "")
    if switch in ("force", "off"):
        return switch == "force"
    release = _release(_installed_torch() if version is None else version)
    return release is not None and release < GLOO_FLIGHT_RECORDER


def mechanisms(version: str | None = None, environ: dict[str, str] | os._Environ | None = None) -> dict[str, str]:
    """Backend -> what records its C++-issued collectives on this torch.

    >>> mechanisms("2.4.1", {})
    {'gloo': 'the dispatcher fallback', 'nccl': 'Flight Recorder'}
    """
    gloo = DISPATCHER if gloo_fallback_wanted(version, environ) else FLIGHT_RECORDER
    return {"gloo": gloo, "nccl": FLIGHT_RECORDER}


def startup_line(version: str | None = None, environ: dict[str, str] | os._Environ | None = None) -> str:
    """The one line ``record`` and ``enable()`` print at start-up.

    >>> print(startup_line("2.13.0+cpu", {}))
    torch 2.13.0+cpu: C++-issued collectives (DDP, FSDP) by Flight Recorder on gloo and nccl; others by the patch layer
    >>> "by the dispatcher fallback on gloo (no Flight Recorder for gloo before torch 2.8)" in startup_line("2.6.0", {})
    True
    """
    version = _installed_torch() if version is None else version
    by = mechanisms(version, environ)
    if by["gloo"] == by["nccl"]:
        how = f"by {by['nccl']} on gloo and nccl"
    else:
        why = "no Flight Recorder for gloo before torch 2.8" if gloo_fallback_wanted(version, {}) else \
            f"{ENV_FALLBACK} forces it"
        how = f"by {by['nccl']} on nccl, by {by['gloo']} on gloo ({why})"
    return f"torch {version}: C++-issued collectives (DDP, FSDP) {how}; others by the patch layer"
