"""Tool schemas derived from Python signatures and docstrings, in each provider's shape; what a
``tools=[...]`` naming no registered tool does; and the adapters as optional extras."""

from __future__ import annotations

import enum
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import openai as sdk
import pytest

import durabl.llm
from durabl import Runtime, ToolMode, events, tool
from durabl.errors import BadStepError
from durabl.llm.schemas import (
    anthropic_tool,
    chat_tool,
    responses_tool,
    tool_call,
    tool_schema,
)

from .servers import ModelServer
from .support import FORECAST_SCHEMA, TOOLS, ask, get_forecast


class Sky(enum.Enum):
    SUN = "sun"
    RAIN = "rain"


def taking(annotation: Any) -> Any:
    """A function of one parameter ``value`` annotated ``annotation``."""

    def probe(value):  # type: ignore[no-untyped-def]
        return value

    probe.__annotations__ = {"value": annotation}
    return probe


@pytest.mark.parametrize(
    ("annotation", "schema"),
    [
        (str, {"type": "string"}),
        (int, {"type": "integer"}),
        (float, {"type": "number"}),
        (bool, {"type": "boolean"}),
        (list[str], {"type": "array", "items": {"type": "string"}}),
        (list, {"type": "array"}),
        (Sequence[float], {"type": "array", "items": {"type": "number"}}),
        (set[int], {"type": "array", "items": {"type": "integer"}}),
        (tuple[int, ...], {"type": "array", "items": {"type": "integer"}}),
        (
            tuple[float, float],
            {
                "type": "array",
                "prefixItems": [{"type": "number"}, {"type": "number"}],
                "minItems": 2,
                "maxItems": 2,
            },
        ),
        (dict, {"type": "object"}),
        (dict[str, int], {"type": "object", "additionalProperties": {"type": "integer"}}),
        (dict[str, Any], {"type": "object"}),
        (Optional[int], {"type": ["integer", "null"]}),  # noqa: UP045 (the old spelling, on purpose)
        (int | None, {"type": ["integer", "null"]}),
        (str | int, {"type": ["string", "integer"]}),
        (
            list[str] | None,
            {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
        ),
        (Literal["c", "f"], {"type": "string", "enum": ["c", "f"]}),
        (Literal[1, 2, 3], {"type": "integer", "enum": [1, 2, 3]}),
        (Literal["auto", 0], {"enum": ["auto", 0]}),
        (Sky, {"type": "string", "enum": ["sun", "rain"]}),
        (Any, {}),
        (
            Annotated[int, "How many, at most."],
            {"type": "integer", "description": "How many, at most."},
        ),
    ],
)
def test_each_annotation_has_its_json_schema(annotation: Any, schema: dict[str, Any]) -> None:
    parameters = tool_schema(taking(annotation))["parameters"]
    assert parameters["properties"] == {"value": schema}
    assert parameters["required"] == ["value"]


def test_the_forecast_tool_s_schema_is_its_signature_and_docstring() -> None:
    assert tool_schema(TOOLS["get_forecast"]) == FORECAST_SCHEMA
    assert tool_schema(get_forecast) == FORECAST_SCHEMA  # a plain function: the same
    renamed = tool(get_forecast, name="forecast", mode=ToolMode.IDEMPOTENT)
    assert tool_schema(renamed)["name"] == "forecast"


def test_defaults_make_a_parameter_optional_and_are_shown_when_they_are_json() -> None:
    marker = object()

    def search(
        query: str, limit: int = 5, since: str | None = None, sort: Any = marker
    ) -> list[str]:
        return []

    parameters = tool_schema(search)["parameters"]
    assert parameters["required"] == ["query"]
    assert parameters["properties"] == {
        "query": {"type": "string"},
        "limit": {"type": "integer", "default": 5},
        "since": {"type": ["string", "null"], "default": None},
        "sort": {},
    }


def test_a_google_args_section_describes_the_parameters() -> None:
    def book(city: str, nights: int, *, guests: int = 2, idempotency_key: str) -> str:
        """Book a hotel room.

        The cheapest room with a free cancellation is taken.

        Args:
            city (str): Where to stay.
            nights: How many nights, from
                tonight on.
            guests: How many people.
            idempotency_key: Filled in by durabl.

        Returns:
            The booking's reference.
        """
        return "ref"

    schema = tool_schema(book)
    assert schema["description"] == "Book a hotel room."
    properties = schema["parameters"]["properties"]
    assert properties == {
        "city": {"type": "string", "description": "Where to stay."},
        "nights": {"type": "integer", "description": "How many nights, from tonight on."},
        "guests": {"type": "integer", "description": "How many people.", "default": 2},
    }
    assert schema["parameters"]["required"] == ["city", "nights"]


def test_a_numpy_parameters_section_describes_the_parameters() -> None:
    def convert(amount: float, currency: str = "EUR") -> float:
        """Convert an amount of US dollars
        at today's rate.

        Parameters
        ----------
        amount : float
            The dollars to convert.
        currency : str, optional
            The ISO code of the currency
            to convert to.

        Returns
        -------
        float
        """
        return amount

    schema = tool_schema(convert)
    assert schema["description"] == "Convert an amount of US dollars at today's rate."
    assert schema["parameters"]["properties"]["amount"]["description"] == "The dollars to convert."
    assert schema["parameters"]["properties"]["currency"]["description"] == (
        "The ISO code of the currency to convert to."
    )


def test_a_function_without_docstring_or_annotations_is_still_described() -> None:
    def ping(host, *args, **options):  # type: ignore[no-untyped-def]
        return host

    assert tool_schema(ping) == {
        "name": "ping",
        "description": "",
        "parameters": {"type": "object", "properties": {"host": {}}, "required": ["host"]},
    }  # **options: other arguments are accepted, so additionalProperties is left open


def test_what_a_tool_call_cannot_pass_or_json_cannot_say_is_refused_by_name() -> None:
    def positional(city: str, /) -> str:
        return city

    class Point:
        pass

    def plot(at: Point) -> None:
        return None

    with pytest.raises(
        TypeError, match="tool 'positional' has the positional-only parameter 'city'"
    ):
        tool_schema(positional)
    with pytest.raises(TypeError, match=r"tool 'plot' parameter 'at' is annotated .*Point"):
        tool_schema(plot)


def test_each_provider_s_shape() -> None:
    schema = tool_schema(get_forecast)
    assert chat_tool(schema) == {"type": "function", "function": schema}
    assert responses_tool(schema) == {"type": "function", **schema}
    assert anthropic_tool(schema) == {
        "name": "get_forecast",
        "description": "The weather forecast for a city.",
        "input_schema": schema["parameters"],
    }


def test_tool_call_arguments_are_parsed_from_json_and_must_be_an_object() -> None:
    assert tool_call("c1", "get_forecast", '{"city": "Oslo"}')["arguments"] == {"city": "Oslo"}
    assert tool_call("c1", "get_forecast", "")["arguments"] == {}
    with pytest.raises(ValueError, match="tool 'get_forecast' with arguments that are not JSON"):
        tool_call("c1", "get_forecast", '{"city": "Os')
    with pytest.raises(ValueError, match="not a JSON object"):
        tool_call("c1", "get_forecast", "[1, 2]")


# -- tools=[...] in a run -------------------------------------------------------------------------


def test_a_tool_name_nobody_registered_holds_the_run_naming_it_and_the_registered_ones(
    server: ModelServer, tmp_path: Path
) -> None:
    with sdk.OpenAI(base_url=server.base_url, api_key="sk-loopback", max_retries=0) as client:
        llm = durabl.llm.openai(client, model="gpt-4o-mini")
        with Runtime(tmp_path / "runs.db", llm=llm, tools=TOOLS) as rt:
            params = {"tools": ["get_forecast", "send_email"]}
            with pytest.raises(BadStepError) as held:
                rt.run(ask, {"prompt": "Email the forecast", "params": params}, run_id="r")
            row = rt.store.get_run("r")
            assert row is not None and row.status == events.HELD
            kinds = [e.kind for e in rt.store.load_log("r") if e.step == 1]
    assert str(held.value) == (
        "run r step 1: the ModelCall offers the model tool 'send_email', which is not "
        "registered (registered: get_forecast)"
    )
    assert kinds == [events.STEP_STARTED]  # the attempt began; nothing failed, nothing retried
    assert server.requests == []  # refused before anything was sent


def test_outside_a_durabl_step_tools_are_passed_as_functions(server: ModelServer) -> None:
    with sdk.OpenAI(base_url=server.base_url, api_key="sk-loopback", max_retries=0) as client:
        llm = durabl.llm.openai(client, model="gpt-4o-mini")
        with pytest.raises(LookupError, match=r"not inside a durabl step.*pass the function"):
            llm("Weather?", tools=["get_forecast"])
        with pytest.raises(TypeError, match="a model prompt must be a str"):
            llm(42)
    assert server.requests == []


# -- the adapters as optional extras ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("adapter", "package", "arguments"),
    [
        ("openai", "openai", {"client": None, "model": "gpt-4o-mini"}),
        ("anthropic", "anthropic", {"client": None, "model": "claude-sonnet-4"}),
        ("litellm", "litellm", {"model": "openai/gpt-4o-mini"}),
    ],
)
def test_an_adapter_without_its_package_names_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch, adapter: str, package: str, arguments: dict[str, Any]
) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # what `import` finds when it is missing
    make = getattr(durabl.llm, adapter)
    with pytest.raises(ImportError) as raised:
        make(**arguments)
    message = str(raised.value)
    assert message == (
        f"durabl.llm.{adapter} needs the {package} package: pip install 'durabl[{package}]'"
    )
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_import_durabl_imports_no_model_sdk() -> None:
    sdks = ("openai", "anthropic", "litellm", "httpx", "httpx2", "pydantic")
    probe = (
        "import sys, durabl, durabl.llm; "
        "assert callable(durabl.llm.openai) and callable(durabl.llm.litellm); "
        f"print(' '.join(m for m in {sdks!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == []
