"""``--attempt N``, and how the other attempts of a job torchrun restarted ended (shared by diagnose, merge
and report): each other attempt is loaded without stacks or profiler traces and diagnosed on its own."""

from __future__ import annotations

import argparse
import dataclasses
import time

from comm2perfetto.diagnose.attempts import attempt_end, attempts_text
from comm2perfetto.diagnose.diagnosis import diagnose
from comm2perfetto.diagnose.findings import AttemptEnd, Diagnosis
from comm2perfetto.model import Job
from comm2perfetto.sources.discover import SourceError


def _attempt_number(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not an attempt number (0, 1, ...)")
    return int(text)


def add_attempt_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--attempt", type=_attempt_number, metavar="N",
                   help="of a job torchrun restarted (--max-restarts), read attempt N (counted from 0, as "
                        "TORCHELASTIC_RESTART_COUNT; attempt N >= 1 is the folder attemptN); default: the last, "
                        "with a note on how the others ended")


def other_attempts(attempt: int, attempts: tuple[int, ...], paths: list[str], force: bool,
                   trace_ranks: dict[str, int]) -> tuple[AttemptEnd, ...]:
    """How every attempt but ``attempt`` ended, each from its own verdict."""
    ends = []
    for k in attempts:
        if k == attempt:
            continue
        try:
            other = _load(paths, force, trace_ranks, k)
        except SourceError as exc:
            ends.append(AttemptEnd(k, None, (), f"not read: {exc}"))
            continue
        ends.append(attempt_end(k, diagnose(other, now_ns=time.time_ns())))
    return tuple(ends)


def _load(paths: list[str], force: bool, trace_ranks: dict[str, int], attempt: int) -> Job:
    from comm2perfetto.match import load_job

    return load_job(paths, force=force, with_stacks=False, read_traces=False, trace_ranks=trace_ranks,
                    attempt=attempt)


def with_attempts(diagnosis: Diagnosis, job: Job, paths: list[str], force: bool,
                  trace_ranks: dict[str, int]) -> Diagnosis:
    """``diagnosis`` of ``job``, saying which attempt it is about and how the others ended."""
    if job.attempts == (0,):
        return diagnosis
    return dataclasses.replace(diagnosis, attempt=job.attempt,
                               other_attempts=other_attempts(job.attempt, job.attempts, paths, force, trace_ranks))


def attempts_note(attempt: int, attempts: tuple[int, ...], paths: list[str], force: bool,
                  trace_ranks: dict[str, int], about: str) -> str | None:
    """The line saying which attempt ``about`` describes and how the others ended; None when the job was not
    restarted."""
    if attempts == (0,):
        return None
    return attempts_text(attempt, other_attempts(attempt, attempts, paths, force, trace_ranks), about)

