"""How the other attempts of a job torchrun restarted ended (diagnose, merge and report say it): each is read as
the job was (``LoadOptions.for_attempt``: its dumps and logs, no stacks or profiler traces) and diagnosed on its
own; ``attempts`` words it."""

from __future__ import annotations

import dataclasses
import time

from comm2perfetto.diagnose.attempts import attempt_end, attempts_text
from comm2perfetto.diagnose.diagnosis import diagnose
from comm2perfetto.diagnose.findings import AttemptEnd, Diagnosis
from comm2perfetto.job import Job
from comm2perfetto.match import load_job
from comm2perfetto.sources.discover import SourceError

__all__ = ["attempts_note", "other_attempts", "with_attempts"]


def other_attempts(job: Job) -> tuple[AttemptEnd, ...]:
    """How every attempt of ``job`` but its own ended, each from its own verdict."""
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
