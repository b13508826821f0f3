"""The docs-drift check itself (tests/support/doc_outputs.py): what it forgives and what it catches."""

from __future__ import annotations

from support.doc_outputs import mismatch, normalise, parse_blocks

CWD = "/tmp/pytest-7/docs0"
SHOWN = """\
DESYNC: 1 finding (world size 2, data from ranks 0, 1)
    all_reduce [[512]] Float. Call sites: shape_mismatch.py:46 (ranks 0, 1).
Clock: ranks aligned on 5 collective ends; residual skew 14.6 us""".splitlines()


def test_times_sizes_paths_and_spacing_may_differ():
    actual = ("DESYNC: 1 finding (world size 2, data from ranks 0, 1)\n"
              "    all_reduce [[512]] Float. Call sites:\n    shape_mismatch.py:46 (ranks 0, 1).\n"
              "Clock: ranks aligned on 5 collective ends; residual skew 141.3 us\n")
    assert mismatch(SHOWN, actual, CWD) is None
    assert normalise(f"wrote {CWD}/comm2perfetto-20261125-142123.pftrace (53.2 KB; 4,660 slices)", CWD) == \
        normalise("wrote /home/me/comm2perfetto/comm2perfetto-20261122-034900.pftrace (5.0 KB; 92 slices)", CWD)


def test_torch_28_gloo_connection_lines_are_not_the_tools_output():
    connected = "[Gloo] Rank {} is connected to 1 peer ranks. Expected number of connected peer ranks is : 1\n"
    lines = SHOWN[:1] + [connected.format(1).strip(), connected.format(0).strip()] + SHOWN[1:]
    assert mismatch(SHOWN, "\n".join(lines) + "\n", CWD) is None
    interleaved = "[Gloo] Rank 1" + connected.format(0) + " is connected to 1 peer ranks. Expected number of " \
        "connected peer ranks is : 1\n"
    assert mismatch(SHOWN, SHOWN[0] + "\n" + interleaved + "\n".join(SHOWN[1:]), CWD) is None
    assert mismatch(SHOWN, "\n".join(SHOWN[:1] + ["[Gloo] something else"] + SHOWN[1:]), CWD) is not None


def test_a_changed_line_number_count_or_word_is_caught():
    base = "\n".join(SHOWN)
    for actual in (base.replace(":46", ":47"), base.replace("1 finding", "2 findings"),
                   base.replace("DESYNC", "STUCK"), base.replace("ranks 0, 1)", "ranks 0, 1, 99)")):
        assert mismatch(SHOWN, actual, CWD) is not None, actual


def test_lines_left_out_must_be_marked():
    actual = "\n".join(SHOWN[:2] + ["Note: the recorded job exited with status 1 (job.json)"] + SHOWN[2:])
    assert mismatch(SHOWN, actual, CWD) is not None  # a line the output has and the docs leave out
    assert mismatch(SHOWN[:2] + ["..."] + SHOWN[2:], actual, CWD) is None
    assert mismatch(SHOWN + ["more"], "\n".join(SHOWN), CWD) is not None  # shown, never printed
    assert mismatch(SHOWN[:1] + ["..."], "\n".join(SHOWN), CWD) is None  # the rest cut on purpose
    assert mismatch(["..."] + SHOWN[1:], "\n".join(SHOWN), CWD) is None  # the start cut on purpose
    assert mismatch(SHOWN[1:], "\n".join(SHOWN), CWD) is not None  # ... but not silently


def test_blocks_are_found_with_their_markers_and_sessions():
    text = """\
```bash
pip install x
```

<!-- output of: comm2perfetto demo -->
```
a
```

<!-- checked -->
```
$ comm2perfetto record -o hang -- torchrun job.py
$ comm2perfetto diagnose hang
OK
```

<!-- not checked: racy -->
```
b
```

```
c
```
"""
    blocks = parse_blocks("DOC", text)
    assert [(b.kind, b.note) for b in blocks] == [("output of", "comm2perfetto demo"), ("checked", ""),
                                                  ("not checked", "racy"), ("", "")]
    assert [(s.command, s.expected) for s in blocks[0].steps] == [("comm2perfetto demo", ["a"])]
    assert [(s.command, s.expected) for s in blocks[1].steps] == [
        ("comm2perfetto record -o hang -- torchrun job.py", None), ("comm2perfetto diagnose hang", ["OK"])]
    assert blocks[3].line == 22


def test_a_measured_zero_has_no_unit():
    shown = ["   0  38.0ms   30.0ms  30.3ms      23.9ms   6.41ms  1.65ms          1.01    78.9%"]
    assert mismatch(shown, "   0  14.2ms   4.76ms  9.32ms      1.29ms        0  1.43ms          1.96    13.8%",
                    CWD) is None
    assert mismatch(shown, "   1  14.2ms   4.76ms  9.32ms      1.29ms        0  1.43ms          1.96    13.8%",
                    CWD) is not None
