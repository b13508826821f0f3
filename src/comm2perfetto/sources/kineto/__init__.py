"""torch.profiler (Kineto) traces: which rank a trace is (``rank``), reading it (``reader``), loading a job's
traces (``load``), the collectives they record (``collectives``) and which kernels communicate
(``comm_kernels``). Never imports torch."""
