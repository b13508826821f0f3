"""Shared set-up of the GPU check's job scripts (tests/gpu/device_check.py runs them under
``comm2perfetto record -- torchrun ...``).

On a machine with CUDA and NCCL a job uses NCCL on ``cuda:LOCAL_RANK``; with ``C2P_GPU_CHECK_CPU=1`` (the dry
run on a machine without a GPU) it uses gloo on the CPU, so that the same scripts, flags and checks run
everywhere. ``info(...)`` prints one ``C2P_INFO {json}`` line that the driver reads back.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

CPU = os.environ.get("C2P_GPU_CHECK_CPU") == "1" or not torch.cuda.is_available()


def setup() -> tuple[int, int, torch.device]:
    """Initialise the default group: NCCL on this rank's GPU (eagerly, ``device_id``), or gloo on the CPU."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if CPU:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    return dist.get_rank(), dist.get_world_size(), device


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def info(**fields: object) -> None:
    """One line for the driver: ``C2P_INFO {"rank": 0, ...}``, with the wall-clock time it was written."""
    fields.setdefault("t_ns", time.time_ns())
    fields.setdefault("rank", dist.get_rank() if dist.is_initialized() else None)
    sys.stdout.write("C2P_INFO " + json.dumps(fields, default=str) + "\n")
    sys.stdout.flush()


def nvtx_push(name: str, domain: str | None = None) -> None:
    """A range in an NVTX ``domain`` (the ``nvtx`` package), or in the default domain through
    ``torch.cuda.nvtx`` on a GPU (it raises on a CPU build) and ``nvtx`` elsewhere."""
    import nvtx

    if domain is None and not CPU:
        torch.cuda.nvtx.range_push(name)
    else:
        nvtx.push_range(name, domain=domain)


def nvtx_pop(domain: str | None = None) -> None:
    import nvtx

    if domain is None and not CPU:
        torch.cuda.nvtx.range_pop()
    else:
        nvtx.pop_range(domain=domain)
