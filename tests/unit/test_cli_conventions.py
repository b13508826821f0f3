"""One convention across the subcommands: -o/--output, exit statuses in every --help, old spellings kept,
the commands that run torch saying so in one line when it is missing, and one root for the errors that exit 2."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import comm2perfetto
from comm2perfetto.cli import COMMANDS, build_parser
from comm2perfetto.errors import Comm2PerfettoError
from support.cli import COMMAND, run_cli


def _help(*argv: str) -> str:
    code, out, err = run_cli(*argv, "--help")
    assert code == 0, err
    return out


def test_top_level_help_has_examples():
    text = _help()
    assert "examples:\n  comm2perfetto demo" in text
    for command in ("record -o run1 -- torchrun", "diagnose run1", "merge run1", "report run1"):
        assert f"comm2perfetto {command}" in text


@pytest.mark.parametrize("command", COMMANDS)
def test_every_help_lists_exit_statuses_and_output(command):
    text = _help(command)
    assert "\nexit status:\n" in text and "  2  usage or input error" in text
    if command not in ("open", "top"):  # open serves a trace, top shows a table; every other command writes one
        assert "-o " in text and "--output" in text


def test_record_explains_its_command_and_keeps_out():
    text = _help("record")
    assert "usage: comm2perfetto record [options] -- COMMAND [ARGS...]" in text
    assert "the job's launch command, after '--'" in text
    for spelling in ("-o", "--output", "--out"):
        assert build_parser("record").parse_args(["record", spelling, "d", "--", "x"]).out == "d"


@pytest.mark.parametrize("spelling", ["--nproc-per-node", "--nproc_per_node", "--nproc"])
def test_demo_takes_torchruns_spelling_and_the_old_one(spelling):
    assert build_parser("demo").parse_args(["demo", spelling, "3"]).nproc == 3


@pytest.mark.parametrize("argv", [["record", "--", "true"], ["demo"]])
def test_commands_that_run_torch_say_when_it_is_missing(tmp_path, argv):
    hide = "import sys; sys.modules['torch'] = None; from comm2perfetto.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", hide, *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "torch is not installed" in proc.stderr
    assert "pip install 'comm2perfetto[record]'" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written


def test_demo_never_replaces_earlier_outputs_silently(tmp_path):
    (tmp_path / "run.html").write_text("mine")
    code, _, err = run_cli("demo", "-o", str(tmp_path / "run"))
    assert code == 2
    assert err.count("\n") == 1 and "run.html exists" in err and "--overwrite" in err
    assert (tmp_path / "run.html").read_text() == "mine" and not (tmp_path / "run").exists()


def test_demo_never_replaces_an_earlier_recording_silently(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "rank0.events.jsonl").write_text("")
    code, _, err = run_cli("demo", "-o", str(tmp_path / "run"))
    assert code == 2
    assert "already holds a recording" in err and "--overwrite" in err
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["rank0.events.jsonl"]


def _error_classes() -> dict[str, type[BaseException]]:
    """Every exception class the package defines (its scripts and the recorder's injected boot code aside)."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(comm2perfetto.__path__, "comm2perfetto."):
        if info.name.endswith("__main__") or info.name.startswith(("comm2perfetto.examples",
                                                                   "comm2perfetto.record._boot")):
            continue
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == info.name:
                found[f"{info.name}.{obj.__qualname__}"] = obj
    return found


def test_every_error_the_package_defines_has_the_one_root_and_keeps_its_builtin_base():
    classes = _error_classes()
    assert len(classes) >= 12, sorted(classes)  # the readers', the CLI's, the plot's, the trace check's
    assert [name for name, cls in classes.items() if not issubclass(cls, Comm2PerfettoError)] == []
    # callers that catch a reader's error by its built-in base (a bad file skipped on ValueError) still do
    for name in ("sources.fr.dump.FrFormatError", "sources.event_log.EventLogError", "sources.limits.TooLargeError",
                 "sources.kineto.reader.KinetoFormatError", "sources.live.LiveSnapshotError", "errors.OptionError"):
        assert issubclass(classes[f"comm2perfetto.{name}"], ValueError), name
    assert issubclass(classes["comm2perfetto.render.report_plot.PlotDependencyError"], ImportError)


def test_an_error_of_the_root_from_any_layer_is_one_line_and_status_2(tmp_path):
    out = tmp_path / "job.pftrace"
    for argv, said in ((["merge", str(tmp_path), "-o", str(tmp_path / "job.txt")], "unknown output format"),
                       (["merge", str(tmp_path), "-o", str(out), "--trace-rank", "a.json"], "expected FILE=RANK"),
                       (["diagnose", str(tmp_path / "missing")], "no such file or folder")):
        code, _, err = run_cli(*argv)
        assert code == 2, argv
        assert err.startswith(f"comm2perfetto {argv[0]}: error: ") and said in err and err.count("\n") == 1, err


RECORDING = Path(__file__).resolve().parents[1] / "data" / "recording" / "subgroups"  # steps 0-3 recorded


@pytest.mark.parametrize("command", ["merge", "diagnose", "report"])
def test_a_missing_folder_is_named_the_same_way_by_every_reader(tmp_path, command):
    """``merge nowhere`` said "name the trace with -o ..." (it could not pick DIR.pftrace); every reader now
    names the folder that is not there, in one line."""
    for argv in ([command, "nowhere"], [command, str(RECORDING), "nowhere"]):
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(tmp_path)
            code, _, err = run_cli(*argv)
        assert code == 2, argv
        assert err == (f"comm2perfetto {command}: error: nowhere: no such file or folder; give the folder the job's "
                       "dumps were written to\n")


def test_report_refuses_steps_the_job_never_ran_and_unknown_output_formats(tmp_path):
    assert run_cli("report", str(RECORDING), "--steps", "100-200") == (2, "", (
        "comm2perfetto report: error: --steps 100-200: no rank recorded these steps (the job recorded steps 0-3)\n"))
    assert run_cli("report", str(RECORDING), "--steps", "2-200").code == 0  # steps the job ran, and more: a report
    xlsx = tmp_path / "r.xlsx"
    code, _, err = run_cli("report", str(RECORDING), "-o", str(xlsx))
    assert code == 2
    assert err.startswith(f"comm2perfetto report: error: -o {xlsx}: unknown format '.xlsx'") and err.count("\n") == 1
    assert not xlsx.exists()
    html = tmp_path / "r.html"  # what --plot draws: the message says so
    ran = run_cli("report", str(RECORDING), "-o", str(html))
    assert ran.code == 2
    assert ran.err.endswith(f"or give --format (.html is what --plot draws: --plot {html})\n")
    assert run_cli("report", str(RECORDING), "-o", str(xlsx), "--format", "json").code == 0  # asked for: written
    assert xlsx.read_text().startswith("{")


@pytest.mark.parametrize("argv", [["merge", str(RECORDING), "-o", "{tmp}/job.pftrace"],
                                  ["report", str(RECORDING)], ["diagnose", str(RECORDING)],
                                  ["compare", str(RECORDING), str(RECORDING)]])
def test_a_reader_that_leaves_early_is_no_internal_error(tmp_path, argv):
    """``comm2perfetto merge DIR | head -1``: stdout is a pipe nobody reads by the time the summary comes. The
    command's work is done and its exit status says how it went, as when its output is read."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    command = [*COMMAND, *argv]
    expected = subprocess.run(command, capture_output=True, timeout=120).returncode
    assert expected in (0, 1)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader left before anything was written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == expected, err
    assert "internal error" not in err and "Traceback" not in err and "BrokenPipe" not in err, err
