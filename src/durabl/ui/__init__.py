"""The read-only dashboard behind ``durabl ui``: ``server.py`` and the page in ``static/``."""
