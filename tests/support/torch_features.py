"""What the installed torch has, for tests that check a feature only some torch versions offer (the compatibility
matrix, tests/compat/run_matrix.sh, runs the suite on 2.4 to 2.13)."""

from __future__ import annotations

import pytest


def gloo_flight_recorder() -> bool:
    """Whether this torch has a Flight Recorder for gloo (``_dump_fr_trace``: 2.8 on). Torch 2.4-2.7 write no
    gloo dump at all; the dispatcher fallback records DDP's collectives there."""
    import torch._C._distributed_c10d as c10d_C

    return hasattr(c10d_C, "_dump_fr_trace")


def needs_gloo_flight_recorder() -> pytest.MarkDecorator:
    """Skip a test of Flight Recorder's gloo dumps on a torch that has none (2.4-2.7), saying so."""
    return pytest.mark.skipif(not gloo_flight_recorder(), reason="no Flight Recorder for gloo on this torch (2.4-2.7)")
