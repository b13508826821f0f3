"""The recorder in a restarted torchrun attempt (``TORCHELASTIC_RESTART_COUNT`` 1), in this process on a
one-rank gloo group: its files go to ``attempt1/``, and what the attempt before left in the job's store
(torchrun's store outlives an attempt) is not taken for this attempt's stall."""

from __future__ import annotations

import os
import time

import orjson
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import comm2perfetto
from comm2perfetto import layout
from comm2perfetto.record.flight import DUMP_PREFIX_ENV_VARS
from comm2perfetto.sources.event_log import read_event_log
from support.torch_features import gloo_flight_recorder


def test_a_restarted_attempt_records_apart(tmp_path, monkeypatch, fr_env):
    monkeypatch.setenv(layout.RESTART_COUNT_ENV, "1")
    monkeypatch.setenv(layout.MAX_RESTARTS_ENV, "3")
    out = tmp_path / "out"
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        # Attempt 0 (of two ranks) stalled once: rank 1 counted stall 1 in the store the restart keeps.
        store = c10d._get_default_store()
        store.add("comm2perfetto/stall_gen", 1)
        store.set("comm2perfetto/stall/1", orjson.dumps({"rank": 1, "op": "all_reduce", "seq": 3}))
        comm2perfetto.enable(str(out), stall_after=0.4)  # starts at once; the watchdog ticks every 0.1 s
        try:
            dist.all_reduce(torch.ones(2))
            time.sleep(0.5)
            torch_dumps = os.environ[DUMP_PREFIX_ENV_VARS[0]]
        finally:
            comm2perfetto.disable()
    finally:
        dist.destroy_process_group()
    assert not (out / "rank0.events.jsonl").exists()
    log = read_event_log(out / "attempt1" / "rank0.events.jsonl")
    assert (log.header["attempt"], log.header["max_restarts"]) == (1, 3)
    assert [c.op for c in log.calls] == ["all_reduce"]
    assert log.stalls == []  # attempt 0's stall is not this attempt's
    assert bool(sorted((out / "attempt1").glob("rank0.fr.*.pkl"))) is gloo_flight_recorder()  # none on 2.4-2.7
    assert torch_dumps == str(out / "attempt1" / layout.TORCH_DUMP_PREFIX)
