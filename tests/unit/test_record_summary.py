"""record's closing count of stall stack dumps: a node whose ranks only answered another node's stall says so,
instead of "1 stall stack dumps (0 stall(s) detected)"."""

from __future__ import annotations

from comm2perfetto.sources.summary import stacks_text, summarize
from support.factories import T0_NS, EventLog


def _node(tmp_path, stalls: list[str]):
    """One rank's log with these stall reasons, and a stacks file for each."""
    log = EventLog(rank=1, world=2)
    for n, reason in enumerate(stalls, 1):
        log.lines.append(["k", T0_NS + n, reason, 0, None, f"rank1.stacks.{n}.json"])
        (tmp_path / f"rank1.stacks.{n}.json").write_text("{}")
    log.close(T0_NS + 10)
    log.write(tmp_path)
    return summarize(str(tmp_path))


def test_a_node_that_answered_another_nodes_stall(tmp_path):
    assert stacks_text(_node(tmp_path, ["remote"])) == \
        "1 stall stack dump (0 stalls detected by these ranks, 1 dump asked for by another rank)"


def test_a_stall_seen_here(tmp_path):
    assert stacks_text(_node(tmp_path, ["pending", "remote"])) == \
        "2 stall stack dumps (1 stall detected by these ranks, 1 dump asked for by another rank)"


def test_no_stall(tmp_path):
    assert stacks_text(_node(tmp_path, [])) == "0 stall stack dumps"
