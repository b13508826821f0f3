# Injected by `comm2perfetto record` through PYTHONPATH: starts recording in every Python process of the job.
# Then runs the sitecustomize this one shadows, if there is one, so the user's site set-up still happens.
import os as _os
import sys as _sys


def _comm2perfetto_boot() -> None:
    try:
        from comm2perfetto.record.bootstrap import activate_from_env
    except Exception as exc:  # the job's Python may not have comm2perfetto installed
        print(f"comm2perfetto: not recording in pid {_os.getpid()} ({_sys.executable}): {exc}",
              file=_sys.stderr)
        return
    try:
        activate_from_env()
    except Exception as exc:
        print(f"comm2perfetto: not recording in pid {_os.getpid()}: {exc}", file=_sys.stderr)


def _chain_next_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = _os.path.dirname(_os.path.abspath(__file__))
    path = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_comm2perfetto_boot()
_chain_next_sitecustomize()
