"""The durability benchmark: agent runtimes killed with SIGKILL at four windows, every trial
sealed in a receipt, and a leaderboard rebuilt from the receipts alone.

``command`` is the command line; ``run`` plans and runs the trials (``trial`` runs one);
``seal`` seals and verifies receipts; ``board`` turns verified receipts into the leaderboard;
``adapters`` lists the runtimes; ``kit/`` holds what runs inside each runtime's own process.
"""
