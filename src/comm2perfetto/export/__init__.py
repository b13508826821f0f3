"""Trace output: the sink interface, the Perfetto protobuf and Chrome JSON writers, and their checker."""
