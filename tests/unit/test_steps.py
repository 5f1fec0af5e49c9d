"""ModelCall, ToolCall and Sleep: what a workflow yields, its validation and its fingerprint."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from hypothesis import given

from durabl import EncodingError, ModelCall, Sleep, Step, ToolCall
from durabl.engine import new_run_id
from durabl.steps import MAX_SLEEP_S, CtxValue, describe_canonical

from .strategies import PROPERTY_SETTINGS, model_calls, sleeps, steps, tool_calls

# -- ToolCall --------------------------------------------------------------------------------


class TestToolCall:
    @pytest.mark.parametrize("args", [["q"], ("q", 1), "q=otters", 42], ids=repr)
    def test_args_that_are_not_a_dict_are_refused_naming_the_tool_and_the_type(
        self, args: Any
    ) -> None:
        with pytest.raises(TypeError) as caught:
            ToolCall("search", args)
        text = str(caught.value)
        assert "'search'" in text
        assert "dict" in text
        assert type(args).__name__ in text

    @pytest.mark.parametrize("name", ["", None, 7, b"search"], ids=repr)
    def test_a_name_that_is_not_a_non_empty_string_is_refused(self, name: Any) -> None:
        with pytest.raises(TypeError, match="ToolCall name must be a non-empty string"):
            ToolCall(name, {})

    @pytest.mark.parametrize("key", ["", 5, b"k"], ids=repr)
    def test_a_bad_idempotency_key_is_refused(self, key: Any) -> None:
        with pytest.raises(TypeError, match="idempotency_key must be a non-empty string"):
            ToolCall("send_email", {}, idempotency_key=key)

    def test_args_keyed_by_something_unencodable_are_refused_naming_the_tool(self) -> None:
        with pytest.raises(TypeError, match=r"ToolCall\('search'\) args"):
            ToolCall("search", {("q", "lang"): "otters"})

    @pytest.mark.parametrize("key", [1, None], ids=repr)
    def test_args_with_a_key_that_is_not_a_string_are_refused(self, key: Any) -> None:
        """Args become keyword arguments, and a keyword is a string: ``{1: "x"}`` must not be
        silently turned into ``{"1": "x"}``."""
        with pytest.raises(TypeError, match=r"ToolCall\('search'\) args"):
            ToolCall("search", {key: "otters"})

    def test_args_that_are_not_json_are_refused_naming_the_tool(self) -> None:
        with pytest.raises(EncodingError, match=r"ToolCall\('search'\) args"):
            ToolCall("search", {"q": {"otters", "seals"}})

    def test_text_without_a_utf8_form_is_refused_at_construction(self) -> None:
        with pytest.raises(EncodingError, match=r"ToolCall\('search'\) args"):
            ToolCall("search", {"q": "otter \udc80"})

    def test_no_args_means_an_empty_dict(self) -> None:
        assert ToolCall("ping") == ToolCall("ping", {})
        assert ToolCall("ping").args == {}

    def test_args_are_what_the_tool_will_see_after_the_round_trip(self) -> None:
        step = ToolCall("search", {"q": "otters", "pages": (1, 2)})
        assert step.args == {"q": "otters", "pages": [1, 2]}

    def test_changing_the_callers_dict_afterwards_changes_nothing(self) -> None:
        args: dict[str, Any] = {"q": "otters", "tags": ["a"]}
        step = ToolCall("search", args)
        fingerprint = step.fingerprint
        args["q"] = "seals"
        args["tags"].append("b")
        assert step.args == {"q": "otters", "tags": ["a"]}
        assert ToolCall("search", {"q": "otters", "tags": ["a"]}).fingerprint == fingerprint

    def test_equal_args_in_any_order_have_one_fingerprint(self) -> None:
        a = ToolCall("search", {"q": "otters", "limit": 5, "opts": {"x": 1, "y": 2}})
        b = ToolCall("search", {"opts": {"y": 2, "x": 1}, "limit": 5, "q": "otters"})
        assert a.fingerprint == b.fingerprint
        assert a == b
        assert hash(a) == hash(b)

    @pytest.mark.parametrize(
        "other",
        [
            ToolCall("search", {"q": "seals"}),
            ToolCall("search", {"q": "otters", "limit": 5}),
            ToolCall("lookup", {"q": "otters"}),
            ToolCall("search", {"q": "otters"}, idempotency_key="k1"),
            ToolCall("search", {"q": ["otters"]}),
        ],
        ids=["value", "extra-arg", "name", "key", "type"],
    )
    def test_anything_different_changes_the_fingerprint(self, other: ToolCall) -> None:
        base = ToolCall("search", {"q": "otters"})
        assert other.fingerprint != base.fingerprint
        assert other != base

    def test_describe_names_the_tool_and_its_args(self) -> None:
        assert ToolCall("search", {"q": "otters"}).describe() == (
            'ToolCall(\'search\', {"q":"otters"})'
        )

    def test_describe_shortens_long_args(self) -> None:
        described = ToolCall("search", {"q": "o" * 500}).describe()
        assert len(described) < 120
        assert described.endswith("…)")


# -- ModelCall -------------------------------------------------------------------------------


class TestModelCall:
    def test_prompt_and_params_are_kept(self) -> None:
        step = ModelCall("plan it", temperature=0.2, max_tokens=100)
        assert step.prompt == "plan it"
        assert step.params == {"temperature": 0.2, "max_tokens": 100}

    def test_a_structured_prompt_is_allowed(self) -> None:
        step = ModelCall([{"role": "user", "content": "hi"}])
        assert step.prompt == [{"role": "user", "content": "hi"}]

    def test_params_change_the_fingerprint(self) -> None:
        assert ModelCall("p").fingerprint != ModelCall("p", temperature=0).fingerprint
        assert (
            ModelCall("p", temperature=0).fingerprint != ModelCall("p", temperature=1).fingerprint
        )

    def test_param_order_does_not_change_the_fingerprint(self) -> None:
        assert ModelCall("p", a=1, b=2) == ModelCall("p", b=2, a=1)

    def test_a_prompt_that_is_not_json_is_refused_naming_it(self) -> None:
        with pytest.raises(EncodingError, match="ModelCall prompt"):
            ModelCall(object())

    def test_params_that_are_not_json_are_refused_naming_them(self) -> None:
        with pytest.raises(EncodingError, match="ModelCall params"):
            ModelCall("p", stop={"a"})

    def test_a_model_call_and_a_tool_call_never_share_a_fingerprint(self) -> None:
        assert ModelCall("search").fingerprint != ToolCall("search").fingerprint

    def test_describe_shows_the_prompt(self) -> None:
        assert ModelCall("Summarize: otters").describe() == "ModelCall('Summarize: otters')"


# -- Sleep -----------------------------------------------------------------------------------


class TestSleep:
    def test_units_add_up_to_seconds(self) -> None:
        assert Sleep(hours=1).seconds == 3600.0
        assert Sleep(minutes=2).seconds == 120.0
        assert Sleep(days=1).seconds == 86400.0
        assert Sleep(30, minutes=1, hours=1, days=1).seconds == 30 + 60 + 3600 + 86400
        assert Sleep().seconds == 0.0

    def test_one_duration_one_fingerprint_whatever_the_units(self) -> None:
        assert Sleep(hours=1) == Sleep(3600) == Sleep(minutes=60) == Sleep(3600.0)
        assert Sleep(hours=1).fingerprint == Sleep(seconds=3600).fingerprint
        assert Sleep(hours=1).fingerprint != Sleep(hours=2).fingerprint

    @pytest.mark.parametrize(
        "kwargs",
        [{"seconds": -1}, {"hours": -0.5}, {"seconds": -math.inf}],
        ids=["seconds", "hours", "-inf"],
    )
    def test_a_negative_duration_is_refused(self, kwargs: dict[str, float]) -> None:
        with pytest.raises(ValueError, match="zero or more seconds"):
            Sleep(**kwargs)

    def test_nan_is_refused(self) -> None:
        with pytest.raises(ValueError, match="nan"):
            Sleep(math.nan)

    @pytest.mark.parametrize(
        "kwargs",
        [{"days": 365 * 101}, {"seconds": MAX_SLEEP_S + 1}, {"hours": math.inf}],
        ids=["101-years", "a-century-and-a-second", "inf"],
    )
    def test_more_than_a_century_is_refused_as_a_unit_mistake(
        self, kwargs: dict[str, float]
    ) -> None:
        with pytest.raises(ValueError, match="longer than a century"):
            Sleep(**kwargs)

    def test_exactly_a_century_is_allowed(self) -> None:
        assert Sleep(MAX_SLEEP_S).seconds == MAX_SLEEP_S

    @pytest.mark.parametrize(
        ("label", "kwargs"),
        [
            ("seconds", {"seconds": True}),
            ("hours", {"hours": False}),
            ("seconds", {"seconds": "60"}),
            ("minutes", {"minutes": None}),
            ("days", {"days": [1]}),
        ],
        ids=["bool", "bool-hours", "str", "none", "list"],
    )
    def test_a_value_that_is_not_a_number_is_refused_naming_the_unit(
        self, label: str, kwargs: dict[str, Any]
    ) -> None:
        with pytest.raises(TypeError, match=f"Sleep {label} must be a number"):
            Sleep(**kwargs)

    def test_describe_shows_seconds(self) -> None:
        assert Sleep(hours=1).describe() == "Sleep(3600 s)"


# -- every step ------------------------------------------------------------------------------


def test_ctx_reads_have_their_own_fingerprints() -> None:
    fingerprints = {CtxValue(what).fingerprint for what in ("now", "random", "uuid")}
    assert len(fingerprints) == 3
    assert CtxValue("now").describe() == "ctx.now()"


@PROPERTY_SETTINGS
@given(steps)
def test_the_recorded_canonical_text_describes_the_step_as_it_describes_itself(
    step: Step,
) -> None:
    assert describe_canonical(step.canonical) == step.describe()
    assert repr(step) == step.describe()


@PROPERTY_SETTINGS
@given(tool_calls | model_calls | sleeps)
def test_a_step_rebuilt_from_its_arguments_is_the_same_step(step: Step) -> None:
    if isinstance(step, ToolCall):
        again: Step = ToolCall(step.name, step.args, idempotency_key=step.idempotency_key)
    elif isinstance(step, ModelCall):
        again = ModelCall(step.prompt, **step.params)
    else:
        assert isinstance(step, Sleep)
        again = Sleep(step.seconds)
    assert again == step
    assert again.fingerprint == step.fingerprint


def test_describe_canonical_falls_back_to_the_text_it_cannot_read() -> None:
    assert describe_canonical("not json") == "not json"
    assert describe_canonical('["unknown",1]') == '["unknown",1]'


def test_every_kind_of_step_has_exactly_one_executor() -> None:
    """A new step kind needs its executor in ``durabl.execute.EXECUTORS``, or the drive would
    have nothing to hand it to."""
    from durabl import steps
    from durabl.execute import EXECUTORS

    kinds = {
        value
        for value in vars(steps).values()
        if isinstance(value, type) and issubclass(value, steps.Step) and value is not steps.Step
    }
    assert kinds == set(EXECUTORS)


def test_new_run_ids_are_32_hex_digits_that_sort_by_creation() -> None:
    ids = []
    for _ in range(5):
        ids.append(new_run_id())
        time.sleep(0.001)  # a millisecond apart: the leading microseconds differ
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert ids == sorted(ids)
    assert len({i[14:] for i in ids}) == 5, "the random part repeats"
    assert abs(int(ids[0][:14], 16) / 1e6 - time.time()) < 60
