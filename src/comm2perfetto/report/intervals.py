"""The interval arithmetic ``report`` measures with, now in ``comm2perfetto.intervals`` (the profile reader in
``sources/`` reduces traces with it too); imported from here as before."""

from comm2perfetto.intervals import NS, Measured, Span, difference, envelope, intersection, length, union

__all__ = ["NS", "Measured", "Span", "difference", "envelope", "intersection", "length", "union"]
