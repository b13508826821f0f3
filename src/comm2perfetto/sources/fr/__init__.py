"""Flight Recorder dumps: ``dump`` parses a file (pickle or JSON, every format), ``ingest`` turns a rank's entries
into columns, ``tables`` interns stacks and signatures job-wide. Never imports torch."""
