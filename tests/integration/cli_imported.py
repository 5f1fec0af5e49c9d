"""A module that says it was imported: ``durabl --import cli_imported`` appends a line to the file
named by ``DURABL_TEST_CALLS``, so a test can tell that a command loaded the modules it was given.
"""

from __future__ import annotations

import os

_calls = os.environ.get("DURABL_TEST_CALLS")
if _calls:
    with open(_calls, "a") as handle:
        handle.write("imported\tcli_imported\n")
