"""Functional collectives (``torch.distributed._functional_collectives``, what DTensor calls), recorded
in-process on a one-rank gloo group: every form of their ``group`` argument resolves to the process group,
each call is one record with Flight Recorder's sequence number, aliases that call their successor are
recorded once, and the patch comes off again."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh

import comm2perfetto
from comm2perfetto.record import ops, patch
from comm2perfetto.record.bootstrap import install_functional_patches
from comm2perfetto.sources.event_log import read_event_log

# funcol.all_gather_single and reduce_scatter_single exist from torch 2.13; earlier, DTensor calls the *_tensor forms.
HAS_SINGLE = hasattr(funcol, "reduce_scatter_single")


def test_install_and_uninstall_functional():
    names = [spec.name for spec in ops.FUNCTIONAL_OPS if hasattr(funcol, spec.name)]
    assert {"all_reduce", "all_gather_tensor", "reduce_scatter_tensor", "all_to_all_single", "broadcast",
            "all_reduce_coalesced"} <= set(names)
    assert HAS_SINGLE == ({"all_gather_single", "reduce_scatter_single"} <= set(names))
    before = {name: getattr(funcol, name) for name in names}
    install_functional_patches(funcol)
    try:
        first = {name: getattr(funcol, name) for name in names}
        install_functional_patches(funcol)  # idempotent: never a wrapper around a wrapper
        for name in names:
            assert getattr(funcol, name) is first[name] and first[name].__c2p_original__ is before[name], name
    finally:
        patch.uninstall()
    assert {name: getattr(funcol, name) for name in names} == before


def test_every_group_form_resolves_to_the_process_group(tmp_path, fr_env):
    out = comm2perfetto.enable(str(tmp_path / "out"), stall_after=None)
    try:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            pg = dist.group.WORLD
            mesh = init_device_mesh("cpu", (1,))
            t = torch.ones(4)
            funcol.all_reduce(t, "sum", pg).wait()  # @pg
            funcol.all_reduce(t, "sum", pg.group_name).wait()  # @name
            funcol.all_reduce(t, "sum", mesh).wait()  # @mesh
            funcol.all_reduce(t, "sum", (mesh, 0)).wait()  # @pair
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # ranks + tag is deprecated
                funcol.all_reduce(t, "sum", [0]).wait()  # @ranks
                gathered = funcol.all_gather_tensor(torch.ones(2, 3), 0, pg).wait()  # @alias
            assert gathered.shape == (2, 3)
            reduce_scatter = funcol.reduce_scatter_single if HAS_SINGLE else funcol.reduce_scatter_tensor
            reduce_scatter(torch.ones(6), "sum", 0, pg).wait()  # @reduce_scatter
            funcol.all_to_all_single(torch.ones(5), None, None, pg).wait()  # @all_to_all
            funcol.broadcast(torch.ones(7), 0, pg).wait()  # @broadcast
            reduced = funcol.all_reduce_coalesced([torch.ones(1), torch.ones(2, 2)], "sum", pg)  # @coalesced
            assert [r.wait().tolist() for r in reduced] == [[1.0], [[1.0, 1.0], [1.0, 1.0]]]
            dist.all_reduce(torch.ones(8))  # @c10d
        finally:
            comm2perfetto.disable()
    finally:
        dist.destroy_process_group()
    log = read_event_log(os.path.join(out, "rank0.events.jsonl"))
    assert log.problems == []
    # Every form names the one group there is: no second `g` record.
    assert [(g.name, list(g.ranks)) for g in log.groups.values()] == [("0", [0])]
    source = Path(__file__).read_text().splitlines()
    expected = [("all_reduce", "@pg", [[4]]), ("all_reduce", "@name", [[4]]), ("all_reduce", "@mesh", [[4]]),
                ("all_reduce", "@pair", [[4]]), ("all_reduce", "@ranks", [[4]]),
                ("all_gather_tensor", "@alias", [[2, 3]]),
                ("reduce_scatter_single" if HAS_SINGLE else "reduce_scatter_tensor", "@reduce_scatter", [[6]]),
                ("all_to_all_single", "@all_to_all", [[5]]), ("broadcast", "@broadcast", [[7]]),
                ("all_reduce_coalesced", "@coalesced", [[1], [2, 2]]), ("all_reduce", "@c10d", [[8]])]
    assert [(c.op, c.shapes) for c in log.calls] == [(op, shapes) for op, _marker, shapes in expected]
    for call, (op, marker, _shapes) in zip(log.calls, expected, strict=True):
        line = next(i for i, text in enumerate(source, 1)
                    if marker in text and "expected" not in text and "HAS_SINGLE else" not in text)
        assert call.site.endswith(f"test_record_functional.py:{line} test_every_group_form_resolves_to_the_"
                                  f"process_group"), (op, marker, call.site)
        assert call.functional == (marker != "@c10d") and call.is_async == call.functional, marker
        assert call.gid == 0 and call.module is None, marker
    # One sequence number each, in order, as Flight Recorder numbers them: nothing recorded twice.
    assert [(c.seq, c.seq_last) for c in log.calls] == [(i, i) for i in range(1, len(expected) + 1)]
    assert log.calls[expected.index(("broadcast", "@broadcast", [[7]]))].peer == 0


def test_calls_while_tracing_are_not_recorded(tmp_path, fr_env):
    """torch.compile and make_fx trace DTensor code with fake tensors: funcol runs, no collective is issued,
    and nothing may be recorded (nor a sequence number taken)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    out = comm2perfetto.enable(str(tmp_path / "out"), stall_after=None)
    try:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            with FakeTensorMode():
                funcol.all_reduce(torch.ones(3), "sum", dist.group.WORLD)
            funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD).wait()
        finally:
            comm2perfetto.disable()
    finally:
        dist.destroy_process_group()
    log = read_event_log(os.path.join(out, "rank0.events.jsonl"))
    assert [(c.op, c.shapes, c.seq) for c in log.calls] == [("all_reduce", [[4]], 1)]
