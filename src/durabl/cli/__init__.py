"""The ``durabl`` command line (``python -m durabl``, the ``durabl`` script): ``main``.

The package's modules import one way, from the bottom: ``options`` (the grammar every command
shares), ``opening`` (what the global options point at), ``render`` (text, tables and JSON), the
commands (``logs``, ``examine``, ``operate``), and ``app`` (the parser and ``main``).
"""

from durabl.cli.app import build_parser, main
from durabl.cli.opening import load_modules

__all__ = ["build_parser", "load_modules", "main"]
