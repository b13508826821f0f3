"""The generated fault matrix in CI (issue 32): a fixed set of specs, every fault class at least once across the
topologies, each a real gloo job recorded by ``comm2perfetto record`` (tests/support/faults.py runs and scores
them as ``benchmarks/fault_sweep.py`` does). Neither diagnose nor the live verdict may call a faulty job healthy
(false_ok) or name a rank the spec did not fault as the culprit (innocent_blamed). A failing spec reruns alone
with ``python benchmarks/fault_sweep.py --spec SPEC``, which prints the path of its job script.
"""

from __future__ import annotations

import pytest

from support.faults import FALSE_OK, FAULTS, INNOCENT_BLAMED, JUDGES, TOPOLOGIES, Spec, failure, sweep

pytestmark = pytest.mark.integration

# The slowest first (sleep waits out gloo's timeout, then torchrun's 30 s grace for the ranks its SIGTERM does
# not end), so it overlaps the rest. Seeds not divisible by 4: a hang is ended by Ctrl-C once the live verdict
# is out, which is quicker than gloo's timeout.
CI_SPECS = [
    "sleep@default,w=2,k=1,r=1,seed=1",
    "reorder@mesh,w=4,k=1,r=0+3,seed=2",
    "none@ddp,w=2,seed=1",
    "skip@pipeline,w=3,k=1,r=1,seed=1",
    "extra@default,w=2,k=1,r=1,seed=1",
    "size@default,w=3,k=1,r=2,seed=1",
    "splits@default,w=3,k=1,r=2,seed=1",
    "dtype@pairs,w=2,k=1,r=1,seed=1",
    "op@ddp,w=2,k=1,r=0,seed=1",
    "group_order@default,w=3,k=1,r=1,seed=1",
    "objects@default,w=2,k=1,r=0,seed=1",
    "sigstop@default,w=2,k=1,r=0,seed=1",
    "gil@default,w=2,k=0,r=1,seed=1",
    "deadlock@pairs,w=2,k=1,r=0,seed=1",
    "kill@pipeline,w=2,k=1,r=1,seed=1",
    "abort@default,w=2,k=1,r=0,seed=1",
    "exception@ddp,w=2,k=1,r=1,seed=1",
]
JOBS_AT_ONCE = 4  # most of a job's time is waiting (start-up, the stall, the gathering, torchrun's teardown)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    return sweep([Spec.parse(s) for s in CI_SPECS], tmp_path_factory.mktemp("fault-sweep"), JOBS_AT_ONCE)


def test_the_set_covers_every_fault_and_topology():
    specs = [Spec.parse(s) for s in CI_SPECS]
    assert {s.fault for s in specs} == set(FAULTS)
    assert {s.topology for s in specs} == set(TOPOLOGIES)


@pytest.mark.parametrize("judge", JUDGES)
def test_no_healthy_verdict_on_a_faulty_job_and_no_innocent_blamed(outcomes, judge):
    bad = [o for o in outcomes if o.scores[judge] in (FALSE_OK, INNOCENT_BLAMED)]
    lines = []
    for o in bad:
        f = failure(o)
        lines.append(f"{f['spec']}: {judge} {o.scores[judge]}: {f[judge]}; truth {f['truth']}; {f['job']}")
    assert not bad, f"{len(bad)} of {len(outcomes)} jobs:\n" + "\n".join(lines)


def test_every_job_got_to_its_fault(outcomes):
    """A job that hung or died before its fault checked nothing: that is a failure here, not a pass."""
    void = [f"{o.spec}: ended by {o.ended_by}, exit {o.returncode}; {o.folder}/record.err" for o in outcomes
            if not o.reached]
    assert not void, "\n".join(void)
