"""@workflow, the workflow registry, and how a run's input binds to parameters."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from durabl import ToolCall, UnknownWorkflowError, Workflow, workflow
from durabl.workflow import build_registry, resolve

# Workflow names are global; every name here is prefixed so no other suite can collide with it.


@workflow
def unit_research(ctx: Any, topic: str, email: str = "nobody@example.invalid") -> Generator:
    """Research a topic."""
    hits = yield ToolCall("search", {"q": topic})
    return {"topic": topic, "email": email, "hits": hits}


@workflow(name="unit-renamed")
def unit_original_name(ctx: Any) -> Generator:
    yield ToolCall("ping")


@workflow
def unit_open_ended(ctx: Any, topic: str, **rest: Any) -> Generator:
    yield ToolCall("search", {"q": topic})
    return rest


class TestDecorator:
    def test_bare_decorator_registers_under_the_function_name(self) -> None:
        assert isinstance(unit_research, Workflow)
        assert unit_research.name == "unit_research"
        assert resolve("unit_research", {}) is unit_research

    def test_decorator_with_a_name_registers_under_that_name(self) -> None:
        assert unit_original_name.name == "unit-renamed"
        assert resolve("unit-renamed", {}) is unit_original_name

    def test_the_wrapped_function_stays_reachable(self) -> None:
        assert unit_research.__doc__ == "Research a topic."
        assert unit_research.__wrapped__ is unit_research.fn
        assert repr(unit_research) == "<workflow unit_research>"

    def test_calling_a_workflow_returns_its_generator(self) -> None:
        gen = unit_research(None, topic="otters")
        assert gen.send(None) == ToolCall("search", {"q": "otters"})
        with pytest.raises(StopIteration) as stop:
            gen.send(["hit"])
        assert stop.value.value == {
            "topic": "otters",
            "email": "nobody@example.invalid",
            "hits": ["hit"],
        }

    def test_a_plain_function_is_refused(self) -> None:
        def not_a_generator(ctx: Any) -> int:
            return 1

        with pytest.raises(TypeError) as caught:
            workflow(name="unit_not_a_generator")(not_a_generator)
        assert "'unit_not_a_generator'" in str(caught.value)
        assert "generator function" in str(caught.value)

    def test_a_refused_function_is_not_registered(self) -> None:
        def plain(ctx: Any) -> None:
            return None

        with pytest.raises(TypeError):
            workflow(name="unit_never_registered")(plain)
        with pytest.raises(UnknownWorkflowError):
            resolve("unit_never_registered", {})

    def test_a_workflow_without_a_ctx_parameter_is_refused(self) -> None:
        def no_ctx() -> Generator:
            yield ToolCall("ping")

        with pytest.raises(TypeError, match="ctx as its first positional parameter"):
            workflow(name="unit_no_ctx")(no_ctx)

    def test_a_workflow_whose_only_parameter_is_keyword_only_is_refused(self) -> None:
        def keyword_ctx(*, ctx: Any) -> Generator:
            yield ToolCall("ping")

        with pytest.raises(TypeError, match="ctx as its first positional parameter"):
            workflow(name="unit_keyword_ctx")(keyword_ctx)


class TestBind:
    def test_keys_bind_to_parameters_by_name(self) -> None:
        bound = unit_research.bind({"topic": "otters", "email": "a@b.c"})
        assert bound == {"topic": "otters", "email": "a@b.c"}

    def test_keys_that_match_no_parameter_are_ignored(self) -> None:
        assert unit_research.bind({"topic": "otters", "priority": 3}) == {"topic": "otters"}

    def test_defaults_are_used_for_missing_optional_keys(self) -> None:
        bound = unit_research.bind({"topic": "otters"})
        assert bound == {"topic": "otters"}
        gen = unit_research(None, **bound)
        gen.send(None)
        with pytest.raises(StopIteration) as stop:
            gen.send([])
        assert stop.value.value["email"] == "nobody@example.invalid"

    def test_a_missing_required_key_is_a_type_error_naming_it_and_the_keys_given(self) -> None:
        with pytest.raises(TypeError) as caught:
            unit_research.bind({"email": "a@b.c"})
        text = str(caught.value)
        assert "'unit_research'" in text
        assert "'topic'" in text
        assert "email" in text

    def test_no_input_for_a_workflow_with_required_parameters_names_the_key(self) -> None:
        with pytest.raises(TypeError, match="'topic'"):
            unit_research.bind(None)

    def test_var_keyword_receives_every_other_key(self) -> None:
        bound = unit_open_ended.bind({"topic": "otters", "depth": 2, "lang": "en"})
        assert bound == {"topic": "otters", "depth": 2, "lang": "en"}
        gen = unit_open_ended(None, **bound)
        gen.send(None)
        with pytest.raises(StopIteration) as stop:
            gen.send([])
        assert stop.value.value == {"depth": 2, "lang": "en"}

    def test_a_workflow_with_only_ctx_takes_any_input(self) -> None:
        assert unit_original_name.bind({"topic": "otters", "email": "a@b.invalid"}) == {}
        assert unit_original_name.bind({"anything": 1}) == {}
        assert unit_original_name.bind("a plain string") == {}
        assert unit_original_name.bind(None) == {}

    def test_input_for_parameters_must_be_a_dict(self) -> None:
        assert unit_research.bind({"topic": "otters", "other": 1}) == {"topic": "otters"}
        with pytest.raises(TypeError) as caught:
            unit_research.bind(["otters"])
        assert "'unit_research'" in str(caught.value)
        assert "list" in str(caught.value)

    def test_keyword_only_parameters_bind_by_name(self) -> None:
        def keyword_only(ctx: Any, *, topic: str) -> Generator:
            yield ToolCall("search", {"q": topic})

        wf = workflow(name="unit_keyword_only")(keyword_only)
        assert wf.bind({"topic": "otters"}) == {"topic": "otters"}
        assert wf(None, **wf.bind({"topic": "otters"})).send(None) == ToolCall(
            "search", {"q": "otters"}
        )

    def test_a_positional_only_parameter_is_bound_or_refused_up_front(self) -> None:
        """Binding produces keyword arguments; a parameter that cannot take one must be refused
        when the workflow is declared, not when its first run is driven."""

        def positional_only(ctx: Any, topic: str, /) -> Generator:
            yield ToolCall("search", {"q": topic})

        try:
            wf = workflow(name="unit_positional_only")(positional_only)
        except TypeError as refused:
            assert "topic" in str(refused)
            return
        gen = wf(None, **wf.bind({"topic": "otters"}))
        assert gen.send(None) == ToolCall("search", {"q": "otters"})


class TestResolve:
    def test_a_workflow_resolves_to_itself(self) -> None:
        assert resolve(unit_research, {}) is unit_research

    def test_the_runtime_registry_wins_over_the_global_one(self) -> None:
        def other(ctx: Any) -> Generator:
            yield ToolCall("ping")

        mine = Workflow(other, "unit_research")
        assert resolve("unit_research", {"unit_research": mine}) is mine

    def test_a_generator_function_is_wrapped_under_its_name(self) -> None:
        def unit_undecorated(ctx: Any) -> Generator:
            yield ToolCall("ping")

        wf = resolve(unit_undecorated, {})
        assert isinstance(wf, Workflow)
        assert wf.name == "unit_undecorated"

    def test_an_unknown_name_is_refused_listing_the_known_ones(self) -> None:
        with pytest.raises(UnknownWorkflowError) as caught:
            resolve("unit_no_such_workflow", {})
        text = str(caught.value)
        assert "'unit_no_such_workflow'" in text
        assert "unit_research" in text
        assert "@workflow" in text

    def test_something_that_is_not_a_workflow_is_refused(self) -> None:
        with pytest.raises(TypeError, match="expected a workflow, got int"):
            resolve(42, {})

    def test_a_registry_from_a_list_or_a_dict(self) -> None:
        def unit_listed(ctx: Any) -> Generator:
            yield ToolCall("ping")

        from_list = build_registry([unit_research, unit_listed])
        assert sorted(from_list) == ["unit_listed", "unit_research"]
        from_dict = build_registry({"alias": unit_listed})
        assert from_dict["alias"].name == "alias"
        assert build_registry(None) == {}

    def test_a_registry_refuses_what_is_not_a_workflow(self) -> None:
        with pytest.raises(TypeError, match="workflows must be generator functions"):
            build_registry([42])
