"""Model clients for ``Runtime(llm=...)``, what a model call costs, and what a client sees of
the step it answers.

``durabl.llm.openai``, ``durabl.llm.anthropic`` and ``durabl.llm.litellm`` wrap the providers'
own clients (optional extras: ``pip install 'durabl[openai]'`` and so on); each is imported
only when used, so ``import durabl`` needs none of them.
"""

from __future__ import annotations

from durabl.llm.call import Chunk, ModelCallContext, current
from durabl.llm.prices import PRICES, Price

__all__ = ["PRICES", "Chunk", "ModelCallContext", "Price", "current"]
