"""Runs inside the training processes: the only part of comm2perfetto that imports torch."""
