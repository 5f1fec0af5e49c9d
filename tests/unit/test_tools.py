"""tool(), ToolMode, RetryPolicy and the tools registry."""

from __future__ import annotations

import functools
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durabl import RetryPolicy, Tool, ToolMode, tool
from durabl.tools import build_registry

from .strategies import PROPERTY_SETTINGS


def search(q: str) -> list[str]:
    return [q]


def send_email(to: str, body: str, *, idempotency_key: str) -> str:
    return f"sent {idempotency_key}"


# -- modes -----------------------------------------------------------------------------------


class TestModes:
    @pytest.mark.parametrize(
        ("given_mode", "expected"),
        [
            (ToolMode.IDEMPOTENT, ToolMode.IDEMPOTENT),
            ("IDEMPOTENT", ToolMode.IDEMPOTENT),
            (ToolMode.AT_MOST_ONCE, ToolMode.AT_MOST_ONCE),
            ("AT_MOST_ONCE", ToolMode.AT_MOST_ONCE),
        ],
    )
    def test_a_mode_is_an_enum_member_or_its_string(
        self, given_mode: Any, expected: ToolMode
    ) -> None:
        assert tool(search, mode=given_mode).mode is expected

    def test_the_default_mode_is_at_most_once(self) -> None:
        assert tool(search).mode is ToolMode.AT_MOST_ONCE

    @pytest.mark.parametrize("bad", ["EXACTLY_ONCE", "idempotent-ish", "", 3, None], ids=repr)
    def test_an_unknown_mode_is_refused_listing_the_known_ones(self, bad: Any) -> None:
        with pytest.raises(ValueError) as caught:
            tool(search, mode=bad)
        text = str(caught.value)
        assert repr(bad) in text
        assert "IDEMPOTENT" in text
        assert "AT_MOST_ONCE" in text

    def test_modes_are_stable_strings(self) -> None:
        assert ToolMode.IDEMPOTENT == "IDEMPOTENT"
        assert ToolMode.AT_MOST_ONCE == "AT_MOST_ONCE"


# -- tool() ----------------------------------------------------------------------------------


class TestToolWrapper:
    def test_wrapping_keeps_the_function_and_takes_its_name(self) -> None:
        wrapped = tool(search, mode="IDEMPOTENT")
        assert isinstance(wrapped, Tool)
        assert wrapped.fn is search
        assert wrapped.name == "search"
        assert wrapped(q="otters") == ["otters"]

    def test_an_explicit_name_wins(self) -> None:
        assert tool(search, name="web_search").name == "web_search"

    def test_decorator_form(self) -> None:
        @tool(mode=ToolMode.IDEMPOTENT, max_attempts=4)
        def lookup(key: str) -> str:
            return key.upper()

        assert isinstance(lookup, Tool)
        assert (lookup.name, lookup.mode, lookup.max_attempts) == (
            "lookup",
            ToolMode.IDEMPOTENT,
            4,
        )
        assert lookup(key="a") == "A"

    def test_bare_decorator_form(self) -> None:
        @tool
        def ping() -> str:
            return "pong"

        assert isinstance(ping, Tool)
        assert ping.mode is ToolMode.AT_MOST_ONCE
        assert ping() == "pong"

    def test_a_non_callable_is_refused(self) -> None:
        with pytest.raises(TypeError, match="needs a callable"):
            tool(42)

    @pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"], ids=repr)
    def test_max_attempts_must_be_a_positive_int(self, bad: Any) -> None:
        with pytest.raises(ValueError, match="max_attempts must be an int >= 1"):
            tool(search, max_attempts=bad)

    def test_retry_must_be_a_retry_policy(self) -> None:
        with pytest.raises(TypeError, match="RetryPolicy"):
            tool(search, retry={"max_attempts": 3})


class TestWantsKey:
    def test_a_keyword_only_idempotency_key_is_detected(self) -> None:
        assert tool(send_email).wants_key is True

    def test_a_keyword_only_idempotency_key_with_a_default_is_detected(self) -> None:
        def charge(amount: int, *, idempotency_key: str | None = None) -> int:
            return amount

        assert tool(charge).wants_key is True

    def test_a_positional_idempotency_key_is_not_used(self) -> None:
        def charge(amount: int, idempotency_key: str) -> int:
            return amount

        assert tool(charge).wants_key is False

    def test_kwargs_alone_does_not_ask_for_the_key(self) -> None:
        def anything(**kwargs: Any) -> None:
            return None

        assert tool(anything).wants_key is False

    def test_a_tool_without_the_parameter_does_not_get_it(self) -> None:
        assert tool(search).wants_key is False

    def test_a_callable_without_a_signature_does_not_get_it(self) -> None:
        assert tool(print, name="print").wants_key is False

    def test_a_callable_object_is_inspected_by_its_call(self) -> None:
        class Charger:
            def __call__(self, amount: int, *, idempotency_key: str) -> int:
                return amount

        wrapped = tool(Charger(), name="charge")
        assert wrapped.wants_key is True
        assert wrapped.name == "charge"

    def test_a_callable_object_with_a_positional_key_does_not_get_it(self) -> None:
        class Charger:
            def __call__(self, amount: int, idempotency_key: str) -> int:
                return amount

        assert tool(Charger(), name="charge").wants_key is False

    def test_a_decorated_tool_is_read_through_its_wrapped_function(self) -> None:
        def charge(amount: int, *, idempotency_key: str) -> int:
            return amount

        @functools.wraps(charge)
        def logged(*args: Any, **kwargs: Any) -> int:
            return charge(*args, **kwargs)

        assert tool(logged).wants_key is True

    def test_a_partial_is_read_through_its_function(self) -> None:
        def charge(account: str, amount: int, *, idempotency_key: str) -> int:
            return amount

        assert tool(functools.partial(charge, "acct-1"), name="charge").wants_key is True

    def test_a_local_variable_named_like_the_key_does_not_ask_for_it(self) -> None:
        def charge(amount: int, **kwargs: Any) -> int:
            idempotency_key = kwargs.get("key")
            return amount if idempotency_key is None else 0

        assert tool(charge).wants_key is False


class TestToolPolicy:
    DEFAULT = RetryPolicy(max_attempts=5, base_delay=2.0, multiplier=3.0, max_delay=30.0)

    def test_at_most_once_without_retry_settings_is_attempted_once(self) -> None:
        policy = tool(send_email).policy(self.DEFAULT)
        assert policy.max_attempts == 1

    def test_an_explicit_max_attempts_wins_and_keeps_the_runtime_delays(self) -> None:
        policy = tool(send_email, max_attempts=3).policy(self.DEFAULT)
        assert policy == RetryPolicy(3, 2.0, 3.0, 30.0)

    def test_idempotent_without_settings_uses_the_runtime_default(self) -> None:
        assert tool(search, mode="IDEMPOTENT").policy(self.DEFAULT) == self.DEFAULT

    def test_the_tools_own_retry_policy_wins_over_the_runtime(self) -> None:
        own = RetryPolicy(max_attempts=7, base_delay=0.5)
        assert tool(search, mode="IDEMPOTENT", retry=own).policy(self.DEFAULT) == own
        assert tool(send_email, retry=own).policy(self.DEFAULT) == own

    def test_max_attempts_caps_the_tools_own_policy(self) -> None:
        own = RetryPolicy(max_attempts=7, base_delay=0.5, multiplier=1.5, max_delay=9.0)
        policy = tool(search, retry=own, max_attempts=2).policy(self.DEFAULT)
        assert policy == RetryPolicy(2, 0.5, 1.5, 9.0)


# -- RetryPolicy -----------------------------------------------------------------------------


class TestRetryPolicy:
    def test_defaults(self) -> None:
        assert RetryPolicy() == RetryPolicy(3, 1.0, 2.0, 60.0)

    @pytest.mark.parametrize("bad", [0, -3], ids=repr)
    def test_max_attempts_below_one_is_refused(self, bad: int) -> None:
        with pytest.raises(ValueError, match="max_attempts must be at least 1"):
            RetryPolicy(max_attempts=bad)

    @pytest.mark.parametrize("bad", [1.5, True, "3", None], ids=repr)
    def test_max_attempts_that_is_not_an_int_is_refused(self, bad: Any) -> None:
        with pytest.raises(TypeError, match="max_attempts must be an int"):
            RetryPolicy(max_attempts=bad)

    @pytest.mark.parametrize("field", ["base_delay", "multiplier", "max_delay"])
    @pytest.mark.parametrize("bad", [-1, math.nan, math.inf, "1", None, True], ids=repr)
    def test_delays_must_be_finite_and_not_negative(self, field: str, bad: Any) -> None:
        with pytest.raises(ValueError, match=f"RetryPolicy {field} must be a finite number"):
            RetryPolicy(**{field: bad})

    def test_backoff_grows_by_the_multiplier_and_stops_at_max_delay(self) -> None:
        policy = RetryPolicy(max_attempts=10, base_delay=1.0, multiplier=2.0, max_delay=10.0)
        assert [policy.delay_s(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]

    def test_a_multiplier_of_one_is_a_constant_delay(self) -> None:
        policy = RetryPolicy(max_attempts=4, base_delay=5.0, multiplier=1.0)
        assert {policy.delay_s(n) for n in range(1, 5)} == {5.0}

    def test_zero_base_delay_retries_at_once(self) -> None:
        assert RetryPolicy(base_delay=0.0).delay_s(3) == 0.0

    def test_delay_stays_capped_after_very_many_attempts(self) -> None:
        """A patient policy (thousands of attempts, one a minute at most) must keep answering
        max_delay instead of overflowing the exponent."""
        policy = RetryPolicy(max_attempts=5000, base_delay=1.0, multiplier=2.0, max_delay=60.0)
        assert policy.delay_s(2000) == 60.0
        assert policy.delay_s(5000) == 60.0

    @PROPERTY_SETTINGS
    @given(
        base=st.floats(min_value=0, max_value=100),
        multiplier=st.floats(min_value=1, max_value=4),
        cap=st.floats(min_value=0, max_value=3600),
        attempts=st.integers(min_value=1, max_value=60),
    )
    def test_backoff_never_shrinks_and_never_exceeds_the_cap(
        self, base: float, multiplier: float, cap: float, attempts: int
    ) -> None:
        policy = RetryPolicy(attempts, base, multiplier, cap)
        delays = [policy.delay_s(n) for n in range(1, attempts + 1)]
        assert all(0 <= d <= cap for d in delays)
        assert delays == sorted(delays)
        assert all(isinstance(d, float) for d in delays)

    def test_a_policy_is_immutable(self) -> None:
        policy = RetryPolicy()
        with pytest.raises(AttributeError):
            policy.max_attempts = 9  # type: ignore[misc]


# -- the registry a Runtime builds from tools= ------------------------------------------------


class TestRegistry:
    def test_a_bare_callable_is_at_most_once_under_its_key(self) -> None:
        registry = build_registry({"email": send_email})
        entry = registry["email"]
        assert (entry.name, entry.mode, entry.wants_key) == ("email", ToolMode.AT_MOST_ONCE, True)

    def test_a_tool_is_renamed_to_its_key_and_keeps_its_settings(self) -> None:
        own = RetryPolicy(max_attempts=9)
        wrapped = tool(search, mode="IDEMPOTENT", max_attempts=2, retry=own)
        entry = build_registry({"web": wrapped})["web"]
        assert (entry.fn, entry.name, entry.mode, entry.max_attempts, entry.retry) == (
            search,
            "web",
            ToolMode.IDEMPOTENT,
            2,
            own,
        )

    def test_a_tool_under_its_own_name_is_kept_as_is(self) -> None:
        wrapped = tool(search, mode="IDEMPOTENT")
        assert build_registry({"search": wrapped})["search"] is wrapped

    def test_no_tools_is_an_empty_registry(self) -> None:
        assert build_registry(None) == {}

    @pytest.mark.parametrize("key", ["", 3, None], ids=repr)
    def test_a_name_that_is_not_a_non_empty_string_is_refused(self, key: Any) -> None:
        with pytest.raises(TypeError, match="tool names must be non-empty strings"):
            build_registry({key: search})

    def test_a_value_that_is_neither_callable_nor_a_tool_is_refused_naming_it(self) -> None:
        with pytest.raises(TypeError, match="tool 'search' must be a callable or a Tool"):
            build_registry({"search": "https://example.invalid/search"})
