"""The canonical JSON codec, fingerprints and row checksums.

Everything durabl records passes through ``codec``: a value that does not survive it unchanged,
or two spellings of one value that encode differently, would make replay disagree with the first
execution.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from durabl import EncodingError, codec, events

from .strategies import PROPERTY_SETTINGS, json_values

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def reordered(value: Any) -> Any:
    """The same value with every dict's keys inserted in reverse order."""
    if isinstance(value, dict):
        return {key: reordered(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [reordered(item) for item in value]
    return value


# -- encode / decode -------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(json_values)
def test_decode_inverts_encode(value: Any) -> None:
    assert codec.decode(codec.encode(value)) == value


@PROPERTY_SETTINGS
@given(json_values)
def test_encoding_ignores_dict_insertion_order(value: Any) -> None:
    assert codec.encode(reordered(value)) == codec.encode(value)


@PROPERTY_SETTINGS
@given(json_values)
def test_encoding_has_no_whitespace_outside_strings(value: Any) -> None:
    outside_strings = _JSON_STRING.sub("", codec.encode(value))
    assert not any(char.isspace() for char in outside_strings)


@PROPERTY_SETTINGS
@given(json_values)
def test_round_trip_is_idempotent(value: Any) -> None:
    text, seen = codec.round_trip(value)
    assert text == codec.encode(value)
    assert codec.round_trip(seen) == (text, seen)
    assert codec.encode(codec.decode(text)) == text


@PROPERTY_SETTINGS
@given(json_values)
def test_encoding_is_utf8_text(value: Any) -> None:
    text = codec.encode(value)
    assert text.encode("utf-8").decode("utf-8") == text


@PROPERTY_SETTINGS
@given(json_values)
def test_decode_reads_what_json_reads_with_or_without_whitespace(value: Any) -> None:
    text = codec.encode(value)
    assert codec.decode(text) == json.loads(text)
    assert codec.decode(f" {text}\n") == value


@pytest.mark.parametrize("text", ["", "{", '{"a":1}x', "[1,2", '"open'])
def test_decode_refuses_what_is_not_one_json_value(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        codec.decode(text)


@PROPERTY_SETTINGS
@given(st.text())
def test_encode_str_is_encode_of_a_string(text: str) -> None:
    try:
        expected = codec.encode(text)
    except EncodingError:
        with pytest.raises(EncodingError):
            codec.encode_str(text)
        return
    assert codec.encode_str(text) == expected


def test_keys_are_sorted_and_separators_compact() -> None:
    assert codec.encode({"b": 1, "a": [1, 2, {"d": None, "c": True}]}) == (
        '{"a":[1,2,{"c":true,"d":null}],"b":1}'
    )


def test_non_ascii_text_is_kept_as_is() -> None:
    assert codec.encode("naïve ☃") == '"naïve ☃"'


def test_a_tuple_is_seen_as_a_list_on_first_execution_as_on_replay() -> None:
    assert codec.round_trip((1, (2, 3))) == ("[1,[2,3]]", [1, [2, 3]])


def test_float_precision_survives_the_round_trip() -> None:
    for value in (0.1 + 0.2, 1e-310, 1.7976931348623157e308, -0.0, 2.0**53 + 1):
        assert codec.decode(codec.encode(value)) == value


@pytest.mark.parametrize(
    "value",
    [
        math.nan,
        math.inf,
        -math.inf,
        [1.0, math.nan],
        {"x": {"y": math.inf}},
        {1, 2},
        frozenset(),
        b"bytes",
        bytearray(b"x"),
        object(),
        1 + 2j,
        {"when": pytest},
        {("a", "b"): 1},
    ],
    ids=[
        "nan",
        "inf",
        "-inf",
        "nan-in-list",
        "inf-in-dict",
        "set",
        "frozenset",
        "bytes",
        "bytearray",
        "object",
        "complex",
        "module-in-dict",
        "tuple-key",
    ],
)
def test_values_outside_json_are_refused_naming_what(value: Any) -> None:
    with pytest.raises(EncodingError) as caught:
        codec.encode(value, what="the result of ToolCall('search')")
    assert "the result of ToolCall('search')" in str(caught.value)
    assert isinstance(caught.value, TypeError)


def test_round_trip_refuses_what_encode_refuses() -> None:
    with pytest.raises(EncodingError, match="input of workflow 'agent'"):
        codec.round_trip({"xs": {1, 2}}, what="input of workflow 'agent'")


def test_what_may_be_described_by_a_function_called_only_on_refusal() -> None:
    described: list[str] = []

    def what() -> str:
        described.append("called")
        return "the result of ToolCall('search') (run r-1 step 3)"

    assert codec.round_trip({"ok": [1, 2]}, what=what) == ('{"ok":[1,2]}', {"ok": [1, 2]})
    assert described == []
    with pytest.raises(EncodingError, match=r"ToolCall\('search'\) \(run r-1 step 3\)"):
        codec.encode({"xs": {1, 2}}, what=what)
    assert described == ["called"]


def test_a_self_referencing_value_is_refused() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(EncodingError, match="ctx value"):
        codec.encode(loop, what="ctx value")


@pytest.mark.parametrize("key", [1, 2.5, True, None], ids=["int", "float", "bool", "none"])
def test_a_dict_key_that_is_not_a_string_is_refused(key: Any) -> None:
    """A non-str key would be silently rewritten ({1: x} becomes {"1": x}), so a tool or the
    workflow would see a different dict than the one it built: refuse it, naming the value."""
    with pytest.raises(EncodingError, match="ToolCall"):
        codec.encode({key: "x"}, what="ToolCall('search') args")


def test_text_that_is_not_valid_unicode_is_refused_naming_what() -> None:
    """A lone surrogate has no UTF-8 form: it must fail as an EncodingError naming the value,
    not later as a UnicodeEncodeError when the text is hashed or written."""
    with pytest.raises(EncodingError, match="ModelCall prompt"):
        codec.encode("half a pair \ud83d", what="ModelCall prompt")


# -- fingerprints ----------------------------------------------------------------------------


def test_fingerprint_is_stable_across_versions() -> None:
    # Recorded logs compare fingerprints forever; a changed hash would make every stored run
    # look non-deterministic.
    assert codec.fingerprint('["tool","search",{"q":"sea otters"},null]') == (
        "1d08814701d9711046ac"
    )


@PROPERTY_SETTINGS
@given(json_values)
def test_fingerprint_is_a_function_of_the_canonical_text(value: Any) -> None:
    text = codec.encode(value)
    assert codec.fingerprint(text) == codec.fingerprint(codec.encode(reordered(value)))
    assert re.fullmatch(r"[0-9a-f]{20}", codec.fingerprint(text))


@PROPERTY_SETTINGS
@given(json_values, json_values)
def test_different_canonical_texts_have_different_fingerprints(a: Any, b: Any) -> None:
    text_a, text_b = codec.encode(a), codec.encode(b)
    assume(text_a != text_b)
    assert codec.fingerprint(text_a) != codec.fingerprint(text_b)


# -- checksums -------------------------------------------------------------------------------

_KINDS = [
    events.RUN_STARTED,
    events.RUN_RESUMED,
    events.STEP_STARTED,
    events.TOOL_DISPATCHED,
    events.STEP_COMPLETED,
    events.STEP_FAILED,
    events.STEP_RETRY,
    events.TIMER_ARMED,
    events.TIMER_FIRED,
    events.CTX_RECORDED,
    events.DEAD_LETTERED,
    events.DLQ_REDRIVEN,
    events.DLQ_RESOLVED,
    events.RUN_COMPLETED,
    events.RUN_FAILED,
    events.RUN_CANCELLED,
]

_fields = {
    "seq": st.integers(min_value=1, max_value=2**40),
    "kind": st.sampled_from(_KINDS),
    "step": st.integers(min_value=0, max_value=10_000),
    "fp": st.none() | st.from_regex(r"[0-9a-f]{20}", fullmatch=True),
    "data": st.none() | json_values.map(codec.encode),
    "at_s": st.floats(min_value=0, max_value=4e9, allow_nan=False),
}
event_rows = st.fixed_dictionaries(_fields)


def test_checksum_is_stable_across_versions() -> None:
    # Stored rows carry these numbers; changing either formula would make old logs "damaged".
    assert codec.checksum(1, events.RUN_STARTED, 0, None, "{}", 1.5) == 7564957199
    assert codec.checksum_format_0(1, events.RUN_STARTED, 0, None, "{}", 1.5) == 3938685836


def test_a_row_written_in_format_0_still_holds() -> None:
    """Files written before format 1 keep their crcs: reading them must not call them damaged."""
    old = (1, events.RUN_STARTED, 0, None, "{}", 1.5, 3938685836)
    assert codec.first_corrupt([old]) is None
    assert codec.holds(*old)
    assert not codec.holds(*old[:4], "{ }", 1.5, 3938685836)
    assert not codec.holds(*old[:5], 1.25, 3938685836)


@PROPERTY_SETTINGS
@given(
    row=event_rows,
    field=st.sampled_from(sorted(_fields)),
    formula=st.sampled_from([codec.checksum, codec.checksum_format_0]),
    data=st.data(),
)
def test_a_crc_in_either_format_fails_when_any_field_changes(
    row: dict[str, Any], field: str, formula: Any, data: st.DataObject
) -> None:
    other = data.draw(_fields[field].filter(lambda v: v != row[field]), label="other value")
    assert codec.holds(**row, crc=formula(**row))
    assert not codec.holds(**{**row, field: other}, crc=formula(**row))


@PROPERTY_SETTINGS
@given(row=event_rows)
def test_checksum_is_a_32_bit_function_of_the_row_marked_with_its_format(
    row: dict[str, Any],
) -> None:
    assert codec.checksum(**row) == codec.checksum(**dict(reversed(list(row.items()))))
    assert codec.checksum(**row) >> 32 == 1
    assert 0 <= codec.checksum_format_0(**row) < 2**32


@PROPERTY_SETTINGS
@given(row=event_rows)
def test_a_crc_is_checked_by_the_format_it_names(row: dict[str, Any]) -> None:
    """A format 1 crc is not accepted as format 0's, nor the other way round, nor a crc that
    names a format there is none of."""
    new, old = codec.checksum(**row), codec.checksum_format_0(**row)
    assert codec.holds(**row, crc=new) and codec.holds(**row, crc=old)
    for wrong in (new & 0xFFFFFFFF, old | codec.CHECKSUM_FORMAT_1, new + (1 << 32), -old):
        if wrong not in (new, old):
            assert not codec.holds(**row, crc=wrong)


def test_checksum_depends_on_the_time_not_on_its_python_type() -> None:
    """A database hands a REAL column back as a float; a row written with an int time (a clock
    returning whole seconds) must still verify when it is read back."""
    assert codec.checksum(3, events.STEP_STARTED, 1, "ab", "{}", 1000) == codec.checksum(
        3, events.STEP_STARTED, 1, "ab", "{}", 1000.0
    )


def _stored(row: dict[str, Any], crc: int) -> tuple[Any, ...]:
    """``row`` as a store reads it back: its columns in the Event's order, then the crc."""
    return (row["seq"], row["kind"], row["step"], row["fp"], row["data"], row["at_s"], crc)


@PROPERTY_SETTINGS
@given(rows=st.lists(event_rows, max_size=6), data=st.data())
def test_first_corrupt_agrees_with_checksum_row_by_row(
    rows: list[dict[str, Any]], data: st.DataObject
) -> None:
    """The stores verify a log read with ``first_corrupt``, which has ``checksum``'s formula
    inline: the two must agree on every row, and it names the first row that fails."""
    stored = [_stored(row, codec.checksum(**row)) for row in rows]
    assert codec.first_corrupt(stored) is None
    if not rows:
        return
    bad = data.draw(st.integers(min_value=0, max_value=len(rows) - 1), label="damaged row")
    damaged = [*stored[:bad], (*stored[bad][:6], stored[bad][6] ^ 1), *stored[bad + 1 :]]
    assert codec.first_corrupt(damaged) == rows[bad]["seq"]


def test_first_corrupt_reads_an_int_time_as_checksum_does() -> None:
    row = {"seq": 3, "kind": events.STEP_STARTED, "step": 1, "fp": None, "data": None, "at_s": 7}
    for formula in (codec.checksum, codec.checksum_format_0):
        assert codec.first_corrupt([_stored(row, formula(**{**row, "at_s": 7.0}))]) is None
