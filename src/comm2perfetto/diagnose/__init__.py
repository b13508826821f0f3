"""diagnose: why a job is stuck, desynced or crashed, as data (``Diagnosis``), from a loaded ``Job``.

``diagnosis.diagnose`` is the verdict afterwards; ``live.live_diagnosis`` the same verdict from the positions
the ranks published at a stall. Never imports torch.
"""
