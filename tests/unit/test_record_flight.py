"""Flight Recorder's environment: a large enough ring, dumps pointed at the output folder; dumps that leave
inductor unimported."""

from __future__ import annotations

import os
import subprocess
import sys

from comm2perfetto.record.flight import prepare_environment


def test_sets_the_buffer_and_dump_place_when_the_user_did_not(tmp_path):
    env: dict[str, str] = {}
    assert prepare_environment(env, 20000, str(tmp_path)) == []
    assert env == {"TORCH_FR_BUFFER_SIZE": "20000",
                   "TORCH_FR_DUMP_TEMP_FILE": os.path.join(str(tmp_path), "torch_fr_rank_")}


def test_keeps_a_larger_user_buffer(tmp_path):
    env = {"TORCH_FR_BUFFER_SIZE": "50000"}
    assert prepare_environment(env, 20000, str(tmp_path)) == []
    assert env["TORCH_FR_BUFFER_SIZE"] == "50000"


def test_keeps_a_larger_user_buffer_given_by_its_nccl_name(tmp_path):
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "40000"}
    assert prepare_environment(env, 20000, str(tmp_path)) == []
    # Both names then agree, whichever one this torch reads.
    assert env["TORCH_FR_BUFFER_SIZE"] == env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "40000"


def test_raises_a_smaller_user_buffer_with_a_warning(tmp_path):
    env = {"TORCH_FR_BUFFER_SIZE": "100"}
    warnings = prepare_environment(env, 20000, str(tmp_path))
    assert env["TORCH_FR_BUFFER_SIZE"] == "20000"
    assert warnings == [("raising the Flight Recorder buffer from 100 to 20000 entries (TORCH_FR_BUFFER_SIZE) "
                         "so that no entry is dropped between dumps")]


def test_an_unreadable_user_buffer_is_replaced_with_a_warning(tmp_path):
    env = {"TORCH_FR_BUFFER_SIZE": "lots"}
    (warning,) = prepare_environment(env, 20000, str(tmp_path))
    assert "from lots to 20000" in warning
    assert env["TORCH_FR_BUFFER_SIZE"] == "20000"


def test_keeps_the_users_dump_place(tmp_path):
    env = {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/scratch/fr_"}
    prepare_environment(env, 20000, str(tmp_path))
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/scratch/fr_"
    assert "TORCH_FR_DUMP_TEMP_FILE" not in env


DUMP_WITHOUT_INDUCTOR = """
import pickle, sys, threading
import torch, torch.distributed as dist
import torch._C._distributed_c10d as c10d_C
from comm2perfetto.record.flight import without_inductor_import

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
dist.all_reduce(torch.ones(1))
assert "torch._inductor" not in sys.modules
entries = pickle.loads(without_inductor_import(c10d_C._dump_fr_trace))["entries"]
frames = [f["name"] for f in entries[-1]["frames"]]
assert "<module>" in frames and "all_reduce" in frames, frames  # symbolised as ever
assert "torch._inductor" not in sys.modules, "the dump imported inductor"

# A thread importing inductor while a dump runs waits for the stand-in to go, then gets the real module.
got = {}
def importer():
    import torch._inductor
    got["module"] = torch._inductor
def dump_with_an_import_inside():
    thread = threading.Thread(target=importer)
    thread.start()
    thread.join(0.5)  # it is blocked on the stand-in's import lock, held by this dump
    got["waited"] = thread.is_alive()
    got["thread"] = thread
    return c10d_C._dump_fr_trace()
without_inductor_import(dump_with_an_import_inside)
got["thread"].join(120)
assert got["waited"], "the importer did not wait for the dump"
assert got["module"] is sys.modules["torch._inductor"] and hasattr(got["module"], "__file__")
dist.destroy_process_group()
print("ok")
"""


def test_dumps_do_not_import_inductor(tmp_path):
    """A dump symbolises frames without importing torch._inductor (800 modules, a second of CPU), and an
    import of inductor by another thread meanwhile gets the real module."""
    proc = subprocess.run([sys.executable, "-c", DUMP_WITHOUT_INDUCTOR], cwd=tmp_path, capture_output=True,
                          text=True, timeout=240, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
