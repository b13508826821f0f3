"""What a recording does, set by ``comm2perfetto record`` flags or ``enable()`` arguments.

The launcher passes the configuration to every rank process through environment variables, so that
processes started by torchrun, mpirun or any other launcher all see the same settings.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

ENV_DIR = "COMM2PERFETTO_DIR"
ENV_STALL_AFTER = "COMM2PERFETTO_STALL_AFTER"
ENV_PROFILE_STEPS = "COMM2PERFETTO_PROFILE_STEPS"
ENV_SYNC = "COMM2PERFETTO_SYNC"
ENV_MODULES = "COMM2PERFETTO_MODULES"
ENV_FR_BUFFER = "COMM2PERFETTO_FR_BUFFER"
ENV_RUN_ID = "COMM2PERFETTO_RUN_ID"
ENV_LIVE = "COMM2PERFETTO_LIVE"
ENV_GPU_TIMING = "COMM2PERFETTO_GPU_TIMING"
ENV_LIVE_EVERY = "COMM2PERFETTO_LIVE_EVERY"
ENV_FAULT = "COMM2PERFETTO_TEST_FAULT"  # tests only: raise inside the recorder to prove training survives

DEFAULT_STALL_AFTER_S = 60.0
DEFAULT_LIVE_EVERY_S = 60.0
MIN_LIVE_EVERY_S = 2.0  # the watchdog ticks every second: a window needs a few ticks to be gathered
# Flight Recorder keeps a ring of this many entries per process. 20000 entries cost a few tens of MB and,
# with dumps every half ring, leave a long job's history complete.
DEFAULT_FR_BUFFER = 20000


@dataclass
class RecordConfig:
    out_dir: str
    """Folder that receives every rank's files (created if missing)."""
    stall_after_s: float | None = DEFAULT_STALL_AFTER_S
    """A collective pending this long is a stall: dump stacks and Flight Recorder on every rank. None: off."""
    profile_steps: tuple[int, int] | None = None
    """Inclusive range of steps to record with torch.profiler, or None."""
    sync: bool = False
    """Synchronise the call's device around each call so return time is completion time (changes what is
    measured); CPU tensors and calls during a CUDA graph capture are not synchronised."""
    modules: bool = True
    """Track the nn.Module path and pass of each call (global forward hooks: a few microseconds per module call;
    off by itself after a few steps without a call to attribute)."""
    fr_buffer: int = DEFAULT_FR_BUFFER
    """Flight Recorder ring size to ask for when the user has not set a larger one."""
    run_id: str = field(default="")
    """Identifies the job; the same on every rank of one run."""
    gpu_timing: bool = True
    """Time NCCL collectives with CUDA events (``TORCH_NCCL_ENABLE_TIMING=1`` unless the user set it), so Flight
    Recorder has each collective's GPU duration."""
    live: bool = True
    """At a stall, gather every rank's position through the job's store for the live verdict (record/live.py)."""
    live_every_s: float | None = DEFAULT_LIVE_EVERY_S
    """Summarise each window of this many seconds into the log and gather the job's windows through the store
    for live stragglers and metrics (record/window.py, record/gather.py). None: off."""

    def to_env(self) -> dict[str, str]:
        env = {
            ENV_DIR: os.path.abspath(self.out_dir),
            ENV_STALL_AFTER: "off" if self.stall_after_s is None else repr(self.stall_after_s),
            ENV_SYNC: "1" if self.sync else "0",
            ENV_MODULES: "1" if self.modules else "0",
            ENV_FR_BUFFER: str(self.fr_buffer),
            ENV_RUN_ID: self.run_id,
            ENV_LIVE: "1" if self.live else "0",
            ENV_GPU_TIMING: "1" if self.gpu_timing else "0",
            ENV_LIVE_EVERY: "off" if self.live_every_s is None else repr(self.live_every_s),
        }
        if self.profile_steps is not None:
            env[ENV_PROFILE_STEPS] = f"{self.profile_steps[0]}-{self.profile_steps[1]}"
        return env

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> RecordConfig | None:
        env = os.environ if environ is None else environ
        out_dir = env.get(ENV_DIR)
        if not out_dir:
            return None
        stall = env.get(ENV_STALL_AFTER, "")
        every = env.get(ENV_LIVE_EVERY, "")
        steps = env.get(ENV_PROFILE_STEPS)
        return cls(
            out_dir=out_dir,
            stall_after_s=None if stall == "off" else float(stall or DEFAULT_STALL_AFTER_S),
            profile_steps=parse_step_range(steps) if steps else None,
            sync=env.get(ENV_SYNC) == "1",
            modules=env.get(ENV_MODULES, "1") == "1",
            fr_buffer=int(env.get(ENV_FR_BUFFER, DEFAULT_FR_BUFFER)),
            run_id=env.get(ENV_RUN_ID, ""),
            live=env.get(ENV_LIVE, "1") == "1",
            gpu_timing=env.get(ENV_GPU_TIMING, "1") == "1",
            live_every_s=None if every == "off" else float(every or DEFAULT_LIVE_EVERY_S),
        )

    def as_header(self) -> dict:
        d = asdict(self)
        d.pop("out_dir")
        d.pop("run_id")
        d["stall_after_s"] = self.stall_after_s
        return d


def parse_step_range(text: str) -> tuple[int, int]:
    """``"3-5"`` -> (3, 5); ``"4"`` -> (4, 4). Raises ValueError with a readable message."""
    parts = text.strip().split("-")
    try:
        if len(parts) == 1:
            a = b = int(parts[0])
        elif len(parts) == 2:
            a, b = int(parts[0]), int(parts[1])
        else:
            raise ValueError
    except ValueError:
        raise ValueError(f"step range {text!r} is not of the form A-B (for example 3-5)") from None
    if a < 0 or b < a:
        raise ValueError(f"step range {text!r}: need 0 <= A <= B")
    return a, b
