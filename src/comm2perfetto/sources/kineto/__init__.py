"""torch.profiler (Kineto) traces: which rank a trace is (``rank``), reading it (``reader``: the file, with the
event parser ``parse`` and the span parser ``spans``, into the data classes of ``events``; ``fields`` reads a raw
event's numbers, ``classify`` what an event is, ``steps`` the profiler steps on the CPU and the GPU), loading a
job's traces (``load``), the collectives they record (``collectives``) and which kernels communicate
(``comm_kernels``). Never imports torch."""
