"""Small jobs to record: a healthy DDP run (``comm2perfetto demo`` records it), a rank that stops joining
collectives, a shape mismatch and tensor parallelism with DTensor. Each runs as a module of the installed package
(``python -m comm2perfetto.examples.ddp_train --nproc 2``, or under torchrun with ``-m``) or as a script of a
checkout (``examples/README.md``); they share ``_launch`` for their command-line set-up."""
