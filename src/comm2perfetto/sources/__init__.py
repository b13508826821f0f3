"""sources: every file a job leaves behind, found by content, checked once at the boundary, read into model data.

``discover`` finds and loads a job's files; ``fr/`` reads Flight Recorder dumps, ``kineto/`` profiler traces,
``event_log`` the recorder's logs, ``live`` the live verdict's snapshots; ``limits`` holds the bounds each reader
checks against and ``safe_pickle`` the unpickler that runs no code. Never imports torch.
"""
