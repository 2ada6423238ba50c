"""Fairness-key extraction on any input: a location either parses or is a ValidationError,
and reading a key from any body, headers, query and path gives a key that is clean text
within bounds, or none with a reason. Never an exception."""

from django.core.exceptions import ValidationError
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.strategies import FUZZ, header_values, json_bodies
from webhooks.fairness_key import (
    MAX_KEY_LENGTH,
    KeyResult,
    NotJson,
    extract_key,
    parse_json_body,
    parse_location,
)

locations = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        ["body.shop_id", "body.shop.id", "header:X-Shop", "query:shop", "path:0", "path:3"]
    ),
    st.builds(
        lambda kind, name: f"{kind}{name}",
        st.sampled_from(["body.", "header:", "query:", "path:"]),
        st.text(max_size=12),
    ),
)


@FUZZ
@given(text=locations)
def test_a_location_parses_or_is_refused_with_a_reason(text: str) -> None:
    try:
        location = parse_location(text)
    except ValidationError as exc:
        assert "fairness-key location" in str(exc)
        return
    assert location.kind in {"body", "header", "query", "path"} and location.parts


@FUZZ
@given(body=json_bodies)
def test_any_body_parses_or_says_why_not(body: bytes) -> None:
    parsed = parse_json_body(body)
    if isinstance(parsed, NotJson):
        assert parsed.reason


@FUZZ
@given(
    location=st.sampled_from(
        ["body.shop_id", "body.shop.id", "header:X-Shop", "query:shop", "path:0", "path:2"]
    ),
    body=json_bodies,
    headers=st.dictionaries(st.sampled_from(["X-Shop", "x-shop", "Other"]), header_values),
    query=st.dictionaries(st.sampled_from(["shop", "other"]), st.text(max_size=40)),
    path=st.lists(st.text(max_size=40), max_size=3),
)
def test_any_request_gives_a_clean_key_or_a_reason(location, body, headers, query, path) -> None:
    result = extract_key(
        parse_location(location),
        body_json=parse_json_body(body),
        headers=headers,
        query=query,
        path_segments=path,
    )
    assert isinstance(result, KeyResult)
    if result.value is None:
        assert result.missing_reason
    else:
        assert result.value == result.value.strip() and 0 < len(result.value) <= MAX_KEY_LENGTH
        assert result.value.isprintable()
        result.value.encode("utf-8")  # storable: no lone surrogate
