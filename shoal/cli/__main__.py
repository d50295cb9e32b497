"""``python -m shoal.cli``: the ``shoal`` command (what `shoal.experiment` starts its runs with)."""

import sys

from shoal.cli import main

sys.exit(main())
