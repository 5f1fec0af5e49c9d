"""``python -m durabl.bench``: the durability benchmark (see ``durabl.bench.command``)."""

import sys

from durabl.bench.command import main

sys.exit(main())
