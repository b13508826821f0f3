"""What the recorder saw at stalls (``k`` records and the stacks files), as diagnose reads them. No torch."""

from __future__ import annotations

from comm2perfetto.model import Job

MAX_STACK_FRAMES = 12


def stall_times(job: Job) -> list[int]:
    """When the recorder detected stalls, on any rank (aligned to rank 0), earliest first."""
    out: list[int] = []
    for rank, log in job.logs.items():
        off = job.clock.offset_ns.get(rank, 0)
        out.extend(st.t_ns + off for st in getattr(log, "stalls", ()))
    return sorted(out)


def stall_stack(job: Job, rank: int) -> tuple[str, ...]:
    """The rank's main Python stack from its latest stall-stacks file, innermost first."""
    doc = job.stall_stacks.get(rank)
    if not doc:
        return ()
    threads = doc.get("threads") or []
    pending_tids = {p.get("tid") for p in doc.get("pending") or [] if isinstance(p, dict)}
    main = next((t for t in threads if t.get("tid") in pending_tids), None) \
        or next((t for t in threads if t.get("name") == "MainThread"), None) \
        or (threads[0] if threads else None)
    if main is None:
        return ()
    out = []
    for fr in main.get("frames") or []:
        file, line, func = str(fr.get("file", "?")), fr.get("line", 0), str(fr.get("func", ""))
        short = file.rsplit("/", 1)[-1]
        out.append(f"{short}:{line} {func}".rstrip())
        if len(out) >= MAX_STACK_FRAMES:
            break
    return tuple(out)
