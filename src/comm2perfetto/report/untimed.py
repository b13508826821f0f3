"""Why a collective or a send/recv has no duration, in the words every view uses (report's note, the merged
trace's ``duration`` argument): the cause the data shows for that collective, not one cause for all.

Flight Recorder's NCCL entries carry ``duration_ms`` once NCCL retires them, and only with GPU timing
(``TORCH_NCCL_ENABLE_TIMING=1``, which ``record`` sets unless ``--no-gpu-timing``); an entry dumped before its
retirement has none even though timing was on::

    {"profiling_name": "nccl:all_reduce", "collective_seq_id": 18, "state": "completed", "retired": true,
     "duration_ms": 0.00816}
    {"profiling_name": "nccl:all_reduce", "collective_seq_id": 19, "state": "completed", "retired": false}
"""

from __future__ import annotations

from collections.abc import Iterable

from comm2perfetto.job import Job
from comm2perfetto.model import NOT_DONE_STATES, Collective, GroupView

__all__ = ["CPU_NO_END", "NOT_DONE", "P2P_ON_GPU", "gpu_untimed_reason", "untimed_reason"]

NOT_DONE = "not completed when the data was taken"
CPU_NO_END = "no end time recorded (Flight Recorder times no gloo collective; the recorder times the Python calls)"
NOT_RETIRED = ("not yet retired when Flight Recorder last dumped (NCCL writes an entry's duration_ms when it "
               "retires it; other entries of its group have one)")
TIMING_OFF = "GPU timing was off (recorded with --no-gpu-timing)"
NO_GPU_TIME = ("no GPU time in Flight Recorder's entries of its group: TORCH_NCCL_ENABLE_TIMING=0, or none "
               "retired when it dumped")
P2P_ON_GPU = "a send/recv on a GPU: no profiler trace of its kernels, and Flight Recorder does not time one"


def untimed_reason(job: Job, c: Collective) -> str:
    """Why ``c`` (whose ``timing()`` is None) has no duration."""
    if any(s in NOT_DONE_STATES for s in c.states if s is not None):
        return NOT_DONE
    if not c.on_gpu:
        return CPU_NO_END
    return gpu_untimed_reason(job, job.collectives[c.group.uid], c.joined_ranks)


def gpu_untimed_reason(job: Job, group: GroupView, ranks: Iterable[int]) -> str:
    """Why a completed collective of ``group`` on a GPU has no GPU time on ``ranks``: not yet retired where
    other collectives of the group were timed, else GPU timing off where every rank's log says so."""
    if group.gpu_timed:
        return NOT_RETIRED
    configs = [job.logs[r].header.get("config") for r in ranks if r in job.logs]
    if configs and all(isinstance(cf, dict) and cf.get("gpu_timing") is False for cf in configs):
        return TIMING_OFF
    return NO_GPU_TIME
