"""Shared fixtures (their helpers live in tests/support/, importable as ``support.*`` through pyproject's
``pythonpath``).

- ``_no_recorder_left_behind`` (autouse): fails any test that leaves comm2perfetto's patches, hooks or active
  recorder installed in the test process (support/leftovers.py says what counts).
- ``record_job`` (per test) and ``module_jobs`` (per module, for a job several tests read): a
  ``support.jobs.JobRunner`` that runs a tiny job script through the real ``comm2perfetto record`` CLI and reads
  back what it wrote.
- ``fr_env``: os.environ without this process's comm2perfetto/FR settings, restored afterwards.
- ``clean_env``: the environment for subprocesses, without this process's comm2perfetto/FR settings.
- ``built_wheel`` (per session): the package as ``pip install .`` builds it, built once for every test that
  reads or installs it.
- ``example_recordings`` (per session): the shipped DDP and shape-mismatch examples, each recorded once for
  every test that only reads the recording.

And one collection rule: the tests that run real jobs (a ``record_job``, ``module_jobs`` or
``example_recordings`` fixture, or any test file in tests/integration/) are exactly those marked
``integration``, so ``-m "not integration"`` leaves out every real job and nothing else.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from support.jobs import JobRunner, job_env, record_example
from support.leftovers import clean_up_recorder, recorder_leftovers
from support.wheel import build_wheel

JOB_FIXTURES = {"record_job", "module_jobs", "example_recordings"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wrong = []
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        real_jobs = item.path.parent.name == "integration" or bool(JOB_FIXTURES & fixtures)
        if real_jobs != (item.get_closest_marker("integration") is not None):
            wrong.append(item.nodeid)
    if wrong:
        raise pytest.UsageError("tests/integration/ and the `integration` marker must agree (a real job lives in "
                                "tests/integration/, marked; nothing else is marked): " + ", ".join(wrong))


@pytest.fixture(scope="session", autouse=True)
def _gloo_flight_recorder_sized_first() -> None:
    """Torch 2.8 to 2.10 size Flight Recorder's ring once per process, at its first process group, and record
    nothing when ``TORCH_FR_BUFFER_SIZE`` was unset then: a test that makes its group before ``enable()`` would
    switch Flight Recorder off for every later test in this process. Where the collected tests imported torch,
    this process's first group is made here, with the ring sized as ``record`` sizes it."""
    if "torch" not in sys.modules:  # the readers' tests alone: no torch, no group
        return
    import torch.distributed as dist

    from comm2perfetto.record.flight import BUFFER_ENV_VARS, TORCH_DEFAULT_RING, flight_recorder_off_by_default

    if not dist.is_available() or dist.is_initialized() or not flight_recorder_off_by_default():
        return
    before = os.environ.get(BUFFER_ENV_VARS[0])
    os.environ[BUFFER_ENV_VARS[0]] = str(TORCH_DEFAULT_RING)
    try:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        dist.destroy_process_group()
    finally:
        if before is None:
            del os.environ[BUFFER_ENV_VARS[0]]
        else:
            os.environ[BUFFER_ENV_VARS[0]] = before


@pytest.fixture(autouse=True)
def _no_recorder_left_behind():
    before = recorder_leftovers()
    if before:  # a test outside our control leaked: start from a clean slate rather than blame this one
        clean_up_recorder()
    yield
    left = recorder_leftovers()
    if left:
        clean_up_recorder()
        pytest.fail("test left comm2perfetto installed in the test process: " + "; ".join(left))


@pytest.fixture
def record_job(tmp_path: Path) -> JobRunner:
    return JobRunner(tmp_path)


@pytest.fixture(scope="module")
def module_jobs(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> JobRunner:
    """A JobRunner for module-scoped fixtures: one job whose output several tests read."""
    return JobRunner(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]))


@pytest.fixture
def fr_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """enable() writes Flight Recorder and NCCL settings into os.environ: put them back afterwards, and start
    without this process's own."""
    for key in [k for k in os.environ if k.startswith(("COMM2PERFETTO_", "TORCH_FR_", "TORCH_NCCL_"))]:
        monkeypatch.delenv(key)


@pytest.fixture
def clean_env() -> dict[str, str]:
    """The environment for a subprocess, without this process's comm2perfetto/Flight Recorder settings."""
    return job_env()


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkout's wheel (about 10 s to build), once for the session."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


# name -> (example, its arguments, record's): the DDP example with steps 2-4 profiled (gloo's Flight Recorder
# does not time DDP's collectives, the profiler does), and the shape mismatch gloo aborts a rank on.
EXAMPLE_RECORDINGS = {
    "ddp": ("ddp_train.py", ["--epochs", "1", "--steps", "6"], ["--profile-steps", "2-4"]),
    "mismatch": ("shape_mismatch.py", [], []),
}


@pytest.fixture(scope="session")
def example_recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, Path]]:
    """name -> (record's exit status, the recording's folder): the examples recorded once for the session, for
    tests that read them and write nothing into them. What record printed on stderr is kept beside each folder
    (``NAME.stderr``), for a test's failure message."""
    root = tmp_path_factory.mktemp("examples")
    done = {}
    for name, (example, args, record_args) in EXAMPLE_RECORDINGS.items():
        status, err = record_example(root / name, example, args, record_args)
        (root / f"{name}.stderr").write_text(err)
        done[name] = (status, root / name)
    return done
