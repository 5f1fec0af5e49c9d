"""What model calls cost: a price table per model, and the cost of one recorded answer.

Prices are US dollars per million tokens: input, output, and input served from the provider's
prompt cache. The table below holds list prices as the providers published them when it was
written; a contract, a batch discount or a new model differs, so ``Runtime(prices=...)`` adds to
it or overrides it. A model found in neither is priced as unknown (``None``), never as free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens."""

    input: float
    output: float
    cached_input: float | None = None
    """For input tokens read from the prompt cache; None: priced as other input."""

    def __post_init__(self) -> None:
        for name in ("input", "output", "cached_input"):
            value = getattr(self, name)
            if value is None and name == "cached_input":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(
                    f"Price {name} must be a number of dollars of 0 or more, got {value!r}"
                )


PRICES: dict[str, Price] = {
    "gpt-4o": Price(2.50, 10.00, 1.25),
    "gpt-4o-mini": Price(0.15, 0.60, 0.075),
    "gpt-4.1": Price(2.00, 8.00, 0.50),
    "gpt-4.1-mini": Price(0.40, 1.60, 0.10),
    "gpt-4.1-nano": Price(0.10, 0.40, 0.025),
    "o3": Price(2.00, 8.00, 0.50),
    "o4-mini": Price(1.10, 4.40, 0.275),
    "claude-opus-4": Price(15.00, 75.00, 1.50),
    "claude-sonnet-4": Price(3.00, 15.00, 0.30),
    "claude-3-7-sonnet": Price(3.00, 15.00, 0.30),
    "claude-3-5-haiku": Price(0.80, 4.00, 0.08),
}


def price_table(overrides: Mapping[str, Any] | None) -> dict[str, Price]:
    """The built-in table with ``overrides`` (model name to ``Price``) on top."""
    table = dict(PRICES)
    for model, price in (overrides or {}).items():
        if not isinstance(model, str) or not model:
            raise TypeError(f"prices keys must be model names, got {model!r}")
        if not isinstance(price, Price):
            raise TypeError(
                f"prices[{model!r}] must be a durabl.llm.Price(input, output, cached_input), "
                f"got {type(price).__name__}"
            )
        table[model] = price
    return table


def find_price(table: Mapping[str, Price], model: str) -> Price | None:
    """The price of ``model``: its own entry, else the longest entry its name starts with
    ("gpt-4o-2024-08-06" is priced as "gpt-4o"; "gpt-4o-mini-..." as "gpt-4o-mini")."""
    found = table.get(model)
    if found is not None:
        return found
    best = ""
    for name in table:
        if (
            model.startswith(name)
            and len(name) > len(best)
            and model[len(name) : len(name) + 1] in ("-", "@", ":", ".")
        ):
            best = name
    return table[best] if best else None


def cost_usd(
    table: Mapping[str, Price], model: str | None, usage: Mapping[str, Any]
) -> float | None:
    """What an answer with ``usage`` cost, or None when the model is not in the table."""
    if not model:
        return None
    price = find_price(table, model)
    if price is None:
        return None
    tokens_in = _tokens(usage.get("input_tokens", usage.get("prompt_tokens")))
    tokens_out = _tokens(usage.get("output_tokens", usage.get("completion_tokens")))
    cached = min(_tokens(usage.get("cached_tokens")), tokens_in)
    cached_rate = price.input if price.cached_input is None else price.cached_input
    dollars = (tokens_in - cached) * price.input + cached * cached_rate + tokens_out * price.output
    return round(dollars / 1_000_000, 10)


def _tokens(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
