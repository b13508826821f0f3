"""The package's version, in a module of its own so that the recorder can write it into each rank's log without
importing the package's ``__init__`` (which imports the recorder)."""

__version__ = "0.1.0"
