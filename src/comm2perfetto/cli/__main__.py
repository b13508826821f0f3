"""``python -m comm2perfetto.cli``: the same as the ``comm2perfetto`` command."""

import sys

from comm2perfetto.cli import main

sys.exit(main())
