"""comm2perfetto: one picture of a distributed PyTorch job's communication.

In a training script (``comm2perfetto record -- CMD`` does the same without editing it)::

    import comm2perfetto
    comm2perfetto.enable("c2p-run")          # before or after init_process_group
    with comm2perfetto.range("forward"):     # an NVTX range, recorded too
        loss = model(batch)
    comm2perfetto.step()                     # optional: steps are also found from optimizer.step()
"""

from __future__ import annotations

from comm2perfetto._version import __version__
from comm2perfetto.record.api import disable, enable, range, step

__all__ = ["__version__", "disable", "enable", "range", "step"]
