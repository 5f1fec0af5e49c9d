"""``python -m durabl``: the command line."""

import sys

from durabl.cli import main

sys.exit(main())
