"""``--attempt N``, and how the other attempts of a job torchrun restarted ended (shared by diagnose, merge
and report): each other attempt is loaded without stacks or profiler traces and diagnosed on its own."""

from __future__ import annotations

import argparse
import dataclasses
import time

from comm2perfetto.diagnose.attempts import attempt_end, attempts_text
from comm2perfetto.diagnose.diagnosis import diagnose
from comm2perfetto.diagnose.findings import AttemptEnd, Diagnosis
from comm2perfetto.match import load_job
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


def other_attempts(job: Job) -> tuple[AttemptEnd, ...]:
    """How every attempt of ``job`` but its own ended, each from its own verdict (read as ``job`` was, without
    stacks or profiler traces)."""
    ends = []
    for k in job.attempts:
        if k == job.attempt:
            continue
        try:
            other = load_job(job.paths, job.options.for_attempt(k))
        except SourceError as exc:
            ends.append(AttemptEnd(k, None, (), f"not read: {exc}"))
            continue
        ends.append(attempt_end(k, diagnose(other, now_ns=time.time_ns())))
    return tuple(ends)


def with_attempts(diagnosis: Diagnosis, job: Job) -> Diagnosis:
    """``diagnosis`` of ``job``, saying which attempt it is about and how the others ended."""
    if job.attempts == (0,):
        return diagnosis
    return dataclasses.replace(diagnosis, attempt=job.attempt, other_attempts=other_attempts(job))


def attempts_note(job: Job, about: str) -> str | None:
    """The line saying which attempt ``about`` describes and how the others ended; None when the job was not
    restarted."""
    if job.attempts == (0,):
        return None
    return attempts_text(job.attempt, other_attempts(job), about)
