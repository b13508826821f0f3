"""A Flight Recorder dump is untrusted input: loading one must never run code."""

from __future__ import annotations

import os
import pickle
import sys

import pytest

from comm2perfetto.sources.fr.dump import FrFormatError, read_fr_dump
from comm2perfetto.sources.safe_pickle import UnsafePickleError, looks_like_pickle, safe_loads


class _RunsCode:
    """Unpickling this calls os.system: what a crafted 'dump' would do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_plain_data_round_trips():
    doc = {"version": "2.10", "entries": [{"process_group": ("0", "default_pg"), "input_sizes": [[4]],
                                           "time_discovered_started_ns": None, "duration_ms": 0.5, "retired": True}]}
    for protocol in (2, 4, 5):
        assert safe_loads(pickle.dumps(doc, protocol=protocol)) == doc


def test_code_in_a_pickle_is_refused_and_not_run(tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"version": "2.10", "entries": [_RunsCode(str(marker))]}, protocol=2)
    with pytest.raises(UnsafePickleError, match=r"posix\.system|os\.system"):
        safe_loads(payload)
    assert not marker.exists()


def test_crafted_dump_file_is_reported_as_unreadable_not_run(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(_RunsCode(str(marker)), protocol=2))
    with pytest.raises(FrFormatError, match="refused to load"):
        read_fr_dump(path)
    assert not marker.exists()


def test_any_global_is_refused_even_harmless_ones():
    with pytest.raises(UnsafePickleError, match=r"collections\.OrderedDict"):
        safe_loads(pickle.dumps(__import__("collections").OrderedDict(a=1), protocol=2))


def test_torch_typed_list_helper_is_answered_without_importing_torch():
    # What torch's C++ pickler writes for a typed List[int]: GLOBAL torch.jit._pickle build_intlist, REDUCE.
    payload = b"\x80\x02ctorch.jit._pickle\nbuild_intlist\n]q\x00(K\x01K\x02e\x85R."
    had_torch = "torch" in sys.modules
    assert safe_loads(payload) == [1, 2]
    assert ("torch" in sys.modules) == had_torch


def test_pickle_sniffing():
    assert looks_like_pickle(pickle.dumps({}, protocol=2)[:2])
    assert looks_like_pickle(pickle.dumps({}, protocol=5)[:2])
    assert not looks_like_pickle(b'{"version"')
    assert not looks_like_pickle(b"\x80")
