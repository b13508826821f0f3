"""The fault sweep's generator, truth and scoring (tests/support/faults.py), without running a job."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from support.faults import (
    FALSE_OK,
    FAULTS,
    INNOCENT_BLAMED,
    NA,
    PARTIAL,
    RIGHT,
    TOPOLOGIES,
    VOID,
    WRONG,
    Outcome,
    Spec,
    SpecError,
    generate,
    job_script,
    score,
    score_live,
    score_verdict,
    truth,
)


def test_generated_specs_round_trip_through_their_string():
    specs = generate(300, seed=3)
    assert len(specs) == 300
    for spec in specs:
        spec.check()
        assert Spec.parse(str(spec)) == spec


def test_the_generator_is_deterministic_and_covers_every_fault_and_topology():
    assert generate(40, seed=11) == generate(40, seed=11)
    assert generate(40, seed=11) != generate(40, seed=12)
    specs = generate(len(FAULTS), seed=0)
    assert {s.fault for s in specs} == set(FAULTS)  # every fault once in each round of len(FAULTS)
    assert {s.topology for s in generate(100, seed=0)} == set(TOPOLOGIES)
    worlds = [s.world for s in generate(300, seed=5)]
    assert sum(w <= 4 for w in worlds) > 0.8 * len(worlds)  # most jobs small: a job takes seconds


def test_a_healthy_spec_has_no_step_and_no_ranks():
    spec = Spec.parse("none@pairs,w=4,seed=9")
    assert (spec.k, spec.ranks, str(spec)) == (0, (), "none@pairs,w=4,seed=9")
    with pytest.raises(SpecError, match="no step and no faulty ranks"):
        Spec.parse("none@pairs,w=4,k=1,r=0,seed=9")


@pytest.mark.parametrize("text, message", [
    ("skip@default,w=2,k=1,seed=1", "no r="),
    ("skip-default,w=2,k=1,r=0,seed=1", "not a spec"),
    ("skip@default,w=2,k=1,r=0,seed=1,x=2", "unknown fields"),
    ("freeze@default,w=2,k=1,r=0,seed=1", "unknown fault"),
    ("skip@ring,w=2,k=1,r=0,seed=1", "unknown topology"),
    ("skip@default,w=9,k=1,r=0,seed=1", "world size 2 to 8"),
    ("skip@pairs,w=3,k=1,r=0,seed=1", "even world size"),
    ("skip@mesh,w=2,k=1,r=0,seed=1", "world size 4"),
    ("splits@pairs,w=4,k=1,r=0,seed=1", "made on default only"),
    ("reorder@default,w=4,k=1,r=0,seed=1", "made on pairs, mesh only"),
    ("reorder@mesh,w=4,k=1,r=0,seed=1", "takes two ranks"),
    ("reorder@mesh,w=4,k=1,r=0+1,seed=1", "diagonal"),
    ("skip@default,w=2,k=1,r=2,seed=1", "below the world size"),
    ("skip@default,w=4,k=1,r=2+1,seed=1", "ascending"),
    ("skip@default,w=2,k=1,r=0+1,seed=1", "a third rank"),
    ("skip@pairs,w=4,k=1,r=2+3,seed=1", "one pair agree"),
    ("kill@pipeline,w=4,k=1,r=0+2,seed=1", "made on one rank"),
    ("skip@pipeline,w=3,k=1,r=2,seed=1", "the last rank sends nothing"),
    ("gil@default,w=2,k=9,r=0,seed=1", "k from 0 to 5"),
])
def test_specs_the_generator_does_not_make_are_refused(text, message):
    with pytest.raises(SpecError, match=message):
        Spec.parse(text)


def test_every_job_script_is_python_that_says_its_spec_and_marks_its_fault():
    for spec in generate(120, seed=4):
        script = job_script(spec)
        ast.parse(script)
        assert script.startswith(f"# A generated fault job: {spec}\n")
        assert f"--spec '{spec}'" in script
        assert ("# FAULT" in script) == (spec.fault != "none")
        assert ("reached its fault" in script) == (spec.fault != "none")  # how the sweep knows it happened


def test_a_job_script_reads_as_the_job():
    script = job_script(Spec.parse("reorder@mesh,w=4,k=2,r=0+3,seed=4"))
    assert "FAULTY = {0, 3}" in script and "K = 2" in script
    faulty = script[script.index("def faulty_step(i):"):script.index("for i in range(STEPS)")]
    assert faulty.split("\n")[1:3] == ["    dist.all_reduce(t, group=dp)  # FAULT: the other order",
                                       "    dist.all_reduce(t, group=tp)"]
    pipeline = job_script(Spec.parse("skip@pipeline,w=3,k=1,r=1,seed=2"))
    assert "    if rank < world - 1:\n        pass  # FAULT: skipped\n" in pipeline
    split = job_script(Spec.parse("splits@default,w=3,k=1,r=0,seed=2"))
    assert "bad_splits = [2, 3, 1]" in split  # one more to rank 1, one fewer to rank 2: the same total


def test_truth_of_a_healthy_job():
    t = truth(Spec.parse("none@default,w=3,seed=1"))
    assert (t.culprits, t.innocent, t.diagnose, t.stalls) == (set(), {0, 1, 2}, {"ok"}, False)


@pytest.mark.parametrize("text, diagnose, live, stalls", [
    ("kill@default,w=3,k=1,r=1,seed=1", {"crashed"}, {"crashed", "stuck"}, False),
    ("abort@pairs,w=4,k=1,r=2,seed=1", {"crashed"}, {"crashed", "stuck"}, False),
    ("exception@ddp,w=2,k=1,r=0,seed=1", {"crashed"}, {"crashed", "stuck"}, False),
    ("sigstop@default,w=3,k=1,r=1,seed=1", {"stuck"}, {"stuck"}, True),  # seed 1: ended by Ctrl-C
    ("sigstop@default,w=3,k=1,r=1,seed=4", {"stuck", "crashed"}, {"stuck"}, True),  # seed 4: by gloo's timeout
    ("gil@mesh,w=4,k=0,r=3,seed=1", {"stuck"}, {"stuck"}, True),
    ("sleep@default,w=2,k=1,r=1,seed=1", {"stuck", "crashed"}, {"stuck"}, True),  # always gloo's timeout
    ("reorder@pairs,w=4,k=1,r=1,seed=1", {"stuck", "desync"}, {"stuck", "desync"}, True),
    ("group_order@default,w=3,k=1,r=1,seed=1", {"stuck", "desync"}, {"stuck", "desync"}, True),
    ("skip@pipeline,w=3,k=1,r=1,seed=1", {"stuck", "desync"}, {"stuck", "desync"}, True),
    # a skip in a uniform loop shifts the sequence: it shows at the end, as a hang or gloo's abort
    ("skip@default,w=3,k=1,r=1,seed=1", {"stuck", "desync", "crashed"}, {"stuck", "desync"}, None),
    ("size@default,w=3,k=1,r=1,seed=1", {"desync", "crashed", "stuck"}, {"desync", "crashed", "stuck"}, None),
])
def test_truth_per_fault_class(text, diagnose, live, stalls):
    spec = Spec.parse(text)
    t = truth(spec)
    assert (t.diagnose, t.live, t.stalls) == (diagnose, live, stalls)
    assert t.culprits == set(spec.ranks) and t.innocent == set(range(spec.world)) - set(spec.ranks)


def test_truth_of_two_faulty_ranks():
    t = truth(Spec.parse("reorder@mesh,w=4,k=1,r=0+3,seed=1"))
    assert (t.culprits, t.innocent) == ({0, 3}, {1, 2})


def verdict(status: str, culprits=(), suspects=()) -> dict:
    """A hand-made verdict document, as diagnose --format json writes its top level."""
    return {"status": status, "culprit_ranks": list(culprits), "suspect_ranks": list(suspects), "findings": []}


FAULTY = truth(Spec.parse("skip@default,w=3,k=1,r=1,seed=1"))  # culprit 1; stuck, desync or crashed
TWO = truth(Spec.parse("reorder@mesh,w=4,k=1,r=0+3,seed=1"))  # culprits 0 and 3
HEALTHY = truth(Spec.parse("none@default,w=3,seed=1"))


@pytest.mark.parametrize("t, doc, expected", [
    (FAULTY, verdict("desync", [1]), RIGHT),
    (FAULTY, verdict("crashed", [1], [0]), RIGHT),
    (FAULTY, verdict("ok"), FALSE_OK),
    (FAULTY, verdict("running"), FALSE_OK),
    (FAULTY, verdict("interrupted"), FALSE_OK),
    (FAULTY, verdict("stuck", [2]), INNOCENT_BLAMED),
    (FAULTY, verdict("stuck", [1, 2]), INNOCENT_BLAMED),
    (FAULTY, verdict("stuck", [], [1, 2]), PARTIAL),  # the data could not separate them: suspects, no culprit
    (FAULTY, verdict("stuck", [], [0]), WRONG),
    (FAULTY, verdict("stuck"), WRONG),
    (FAULTY, verdict("incomplete", [1]), WRONG),  # the status is not one the truth allows
    (FAULTY, {"error": "exit status 2: ..."}, WRONG),
    (TWO, verdict("desync", [0, 3]), RIGHT),
    (TWO, verdict("desync", [3]), PARTIAL),
    (TWO, verdict("desync", [3], [0]), PARTIAL),
    (TWO, verdict("desync", [0, 1]), INNOCENT_BLAMED),
    (HEALTHY, verdict("ok"), RIGHT),
    (HEALTHY, verdict("ok", [2]), INNOCENT_BLAMED),
    (HEALTHY, verdict("stuck"), WRONG),
])
def test_scoring_a_verdict(t, doc, expected):
    assert score_verdict(t, doc, t.diagnose) == expected


def event(name: str, doc: dict) -> dict:
    return {"format": "comm2perfetto-stall-verdict", "event": name, "verdict": doc}


HANG = truth(Spec.parse("sigstop@default,w=3,k=1,r=1,seed=1"))  # stalls for sure
CRASH = truth(Spec.parse("kill@default,w=3,k=1,r=1,seed=1"))  # ends at once


@pytest.mark.parametrize("t, last, stalled_s, expected", [
    (HANG, event("stall", verdict("stuck", [1])), 30.0, RIGHT),
    (HANG, event("stall", verdict("ok")), 30.0, FALSE_OK),  # "OK" at a stall
    (HANG, None, 30.0, FALSE_OK),  # no live verdict where the job hung
    (HANG, None, None, FALSE_OK),  # the truth says it hangs, whatever the logs show
    (HANG, event("resolved", verdict("stuck", [1])), 30.0, FALSE_OK),  # "the job went on": it did not
    (HANG, event("stall", verdict("stuck", [0])), 30.0, INNOCENT_BLAMED),
    (HANG, event("stall", verdict("desync", [1])), 30.0, WRONG),
    (FAULTY, None, None, NA),  # might have ended at once: no stall, nothing to judge
    (FAULTY, None, 20.0, FALSE_OK),  # but it went on long after a rank logged a stall
    (CRASH, None, None, NA),
    (CRASH, None, 3.0, NA),  # the dying rank held its peers up for a moment
    (CRASH, event("stall", verdict("crashed", [1])), 3.0, RIGHT),
    (HEALTHY, None, None, NA),
    (HEALTHY, event("resolved", verdict("stuck", [2])), 5.0, RIGHT),  # a late rank, told as over
    (HEALTHY, event("stall", verdict("stuck", [2])), 5.0, INNOCENT_BLAMED),  # never told it resolved
])
def test_scoring_the_live_verdict(t, last, stalled_s, expected):
    assert score_live(t, last, stalled_s) == expected


def test_a_job_that_never_got_to_its_fault_is_void_not_scored():
    """A DDP start-up that outlasted the deadline on a loaded machine: the truth of its fault does not hold."""
    spec = Spec.parse("op@ddp,w=3,k=2,r=1,seed=259")
    never = Outcome(spec, Path("job"), 1, "ctrl-c", False, 60.0, {"status": "incomplete"}, None, [], None)
    assert score(never) == {"diagnose": VOID, "live": VOID}
    got_there = Outcome(spec, Path("job"), 1, "ctrl-c", True, 60.0, {"status": "incomplete"}, None, [], None)
    assert score(got_there) == {"diagnose": WRONG, "live": NA}
