"""The examples in the package's docstrings run as written (raw formats, small helpers' results)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import comm2perfetto

# The examples are scripts run by torchrun (their imports need their own folder on the path); a __main__ runs
# the command line when imported.
MODULES = sorted(m.name for m in pkgutil.walk_packages(comm2perfetto.__path__, "comm2perfetto.")
                 if not m.name.startswith("comm2perfetto.examples") and not m.name.endswith("__main__"))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples of {name} failed"


def test_the_examples_are_found():
    finder = doctest.DocTestFinder()
    examples = sum(len(t.examples) for n in MODULES for t in finder.find(importlib.import_module(n)))
    assert examples >= 50
