"""comm2perfetto: one picture of a distributed PyTorch job's communication.

In a training script (``comm2perfetto record -- CMD`` does the same without editing it)::

    import comm2perfetto
    comm2perfetto.enable("c2p-run")          # before or after init_process_group
    with comm2perfetto.range("forward"):     # an NVTX range, recorded too
        loss = model(batch)
    comm2perfetto.step()                     # optional: steps are also found from optimizer.step()

The recorder's functions are imported when first used: the readers (``comm2perfetto diagnose`` ...) import this
package too, and start faster without the recorder's modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from comm2perfetto._version import __version__

if TYPE_CHECKING:
    from comm2perfetto.record.api import disable, enable, range, step

__all__ = ["__version__", "disable", "enable", "range", "step"]

_RECORDER_API = frozenset(__all__) - {"__version__"}


def __getattr__(name: str) -> Any:
    if name in _RECORDER_API:
        from comm2perfetto.record import api

        return getattr(api, name)
    raise AttributeError(f"module 'comm2perfetto' has no attribute {name!r}")
