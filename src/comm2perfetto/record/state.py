"""The one piece of mutable global state the hot path reads: the active recorder of this process.

Wrappers check ``state.recorder is None`` first, so a process that is not recording (the torchrun agent, a
DataLoader worker, any rank after an internal error) pays one global lookup per call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from comm2perfetto.record.recorder import Recorder

recorder: Recorder | None = None
