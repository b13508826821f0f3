"""The patch layer's install()/uninstall(): idempotent, reversible, in both torch.distributed and
distributed_c10d, and a straight call-through while this process does not record."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from comm2perfetto.record import ops, patch
from comm2perfetto.record.bootstrap import install_patches

c10d = dist.distributed_c10d
HOOKED = ("_update_default_pg", "destroy_process_group")


@pytest.fixture
def originals():
    names = [spec.name for spec in ops.OPS if hasattr(c10d, spec.name)]
    before = {name: getattr(c10d, name) for name in [*names, *HOOKED]}
    before_dist = {name: getattr(dist, name) for name in names if hasattr(dist, name)}
    yield names, before, before_dist
    patch.uninstall()


def test_install_wraps_every_op_in_both_modules(originals):
    names, before, before_dist = originals
    assert {"all_reduce", "broadcast", "send", "batch_isend_irecv", "all_gather_object"} <= set(names)
    install_patches(c10d, dist)
    assert patch.installed()
    for name in [*names, *HOOKED]:
        wrapper = getattr(c10d, name)
        assert wrapper is not before[name], name
        assert wrapper.__c2p_original__ is before[name], name
        assert wrapper.__wrapped__ is before[name] and wrapper.__name__ == before[name].__name__, name
    for name in before_dist:
        assert getattr(dist, name) is getattr(c10d, name), name


def test_install_is_idempotent(originals):
    names, before, _ = originals
    install_patches(c10d, dist)
    first = {name: getattr(c10d, name) for name in names}
    install_patches(c10d, dist)
    install_patches(c10d)
    assert {name: getattr(c10d, name) for name in names} == first
    for name in names:  # never a wrapper around a wrapper
        assert getattr(c10d, name).__c2p_original__ is before[name]


def test_uninstall_restores_the_originals_everywhere(originals):
    _names, before, before_dist = originals
    install_patches(c10d, dist)
    patch.uninstall()
    assert not patch.installed()
    assert {name: getattr(c10d, name) for name in before} == before
    assert {name: getattr(dist, name) for name in before_dist} == before_dist
    patch.uninstall()  # twice is fine
    assert {name: getattr(c10d, name) for name in before} == before
    # And it can be installed again afterwards.
    install_patches(c10d, dist)
    assert dist.all_reduce.__c2p_original__ is before["all_reduce"]


def test_uninstall_leaves_a_function_someone_else_replaced_since(originals):
    _, before, _ = originals
    install_patches(c10d, dist)

    def theirs(*args, **kwargs):
        return "theirs"

    original_dist_barrier = dist.barrier
    dist.barrier = theirs
    try:
        patch.uninstall()
        assert dist.barrier is theirs  # not ours to restore
        assert c10d.barrier is before["barrier"]
    finally:
        dist.barrier = before["barrier"]
    assert original_dist_barrier.__c2p_original__ is before["barrier"]


def test_wrappers_call_straight_through_when_not_recording(originals):
    """No recorder in this process: the wrapper behaves exactly as torch's function, errors included."""
    install_patches(c10d, dist)
    assert not dist.is_initialized()
    with pytest.raises(ValueError) as wrapped_error:
        dist.all_reduce(torch.ones(2))
    with pytest.raises(ValueError) as original_error:
        dist.all_reduce.__c2p_original__(torch.ones(2))
    assert str(wrapped_error.value) == str(original_error.value)
    assert "init_process_group" in str(wrapped_error.value)
