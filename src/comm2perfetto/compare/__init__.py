"""``comm2perfetto compare BASE NEW``: what changed in communication between two runs, noise told apart."""
