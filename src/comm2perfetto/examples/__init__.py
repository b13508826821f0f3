"""Small jobs to record: a healthy DDP run (``comm2perfetto demo`` records it), a rank that stops joining
collectives, a shape mismatch and tensor parallelism with DTensor. Each is a script run under torchrun
(``examples/README.md``); they share ``_launch`` for their command-line set-up."""
