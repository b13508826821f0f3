"""Helpers the tests share, imported as ``from support.factories import FrJob`` (pyproject's pytest options put
tests/ on ``pythonpath``); tests/conftest.py holds only the fixtures and hooks built on them.

- cli.py: run the command line, in the test process or in a new one (the one way tests run it).
- jobs.py: record a tiny job through the real ``comm2perfetto record`` and read back what it wrote.
- leftovers.py: what comm2perfetto still has installed in the test process (the autouse hygiene fixture).
- factories.py: synthetic Flight Recorder dumps, event logs and stall stacks of a job.
- kineto_fixtures.py: synthetic profiler (Kineto) traces.
- hostile.py: hostile inputs, and the CLI run under memory and time limits for them.
- doc_outputs.py: the docs' blocks whose outputs the docs tests check (README, examples/README.md, docs/*.md).
- trace_scenario.py: one trace every writer writes, and what its args decode to.
- browser.py: headless Chromium over the DevTools pipe.
- wheel.py: the package built as a wheel, and installed into a folder of its own.
"""
