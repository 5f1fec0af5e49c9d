"""Model clients for ``Runtime(llm=...)``, what a model call costs, and what a client sees of
the step it answers.

``durabl.llm.openai``, ``durabl.llm.anthropic`` and ``durabl.llm.litellm`` wrap the providers'
own clients (optional extras: ``pip install 'durabl[openai]'`` and so on); each imports its
package only when an adapter is made, so ``import durabl`` needs none of them. Each name is the
adapter function: it stands in this package for the module of the same name, which is still
importable (``from durabl.llm.openai import chat_answer``). ``durabl.llm.schemas`` holds what
they share: tool schemas from Python signatures, and the one answer they all return.

What the runtime itself needs of model calls, the context a client reads (``current()``,
``Chunk``) and the price table (``Price``, ``PRICES``), lives outside this package, in
``durabl.modelcall`` and ``durabl.prices``, and is named here too: ``import durabl`` does not
import the adapters.
"""

from __future__ import annotations

from durabl.llm.anthropic import anthropic
from durabl.llm.litellm import litellm
from durabl.llm.openai import openai
from durabl.modelcall import Chunk, ModelCallContext, current
from durabl.prices import PRICES, Price

__all__ = [
    "PRICES",
    "Chunk",
    "ModelCallContext",
    "Price",
    "anthropic",
    "current",
    "litellm",
    "openai",
]
