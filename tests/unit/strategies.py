"""Hypothesis strategies shared by the unit property tests."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from durabl.steps import DERIVED_KEY_PREFIX, CtxValue, ModelCall, Sleep, ToolCall

PROPERTY_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
"""The machine is noisy: no per-example deadline; enough examples to find edge cases fast."""

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)

json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
"""Any value of the JSON data model, as Python builds it (dicts with str keys)."""

tool_args = st.dictionaries(st.text(max_size=6), json_values, max_size=3)

tool_calls = st.builds(
    ToolCall,
    st.sampled_from(["search", "send_email", "charge_card", "shell"]),
    tool_args,
    # A key may be any text but one in the prefix durabl reserves for the keys it derives.
    idempotency_key=st.none()
    | st.text(min_size=1, max_size=12).filter(lambda key: not key.startswith(DERIVED_KEY_PREFIX)),
)

model_calls = st.builds(
    lambda prompt, params: ModelCall(prompt, **params),
    st.text(max_size=40) | json_values,
    st.dictionaries(st.text(min_size=1, max_size=8), json_values, max_size=2),
)

sleeps = st.builds(Sleep, st.floats(min_value=0, max_value=10 * 86400.0))

ctx_values = st.sampled_from(["now", "random", "uuid"]).map(CtxValue)

steps = tool_calls | model_calls | sleeps | ctx_values
"""Anything a workflow may yield, plus the ctx reads that also take a position in the log."""
