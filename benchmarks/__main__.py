"""``python -m securefed.bench ARGS`` runs the ``securefed`` command line."""

import sys

from securefed.bench.cli import main

sys.exit(main())
