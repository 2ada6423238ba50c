"""core.bearer: the token of an Authorization header, scheme case-insensitive."""

import pytest

from core.bearer import bearer_token


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),
        ("BEARER   abc  ", "abc"),
        ("abc", None),  # a bare token is no credential
        ("Basic abc", None),
        ("Bearer", None),
        ("Bearer    ", None),
        ("", None),
    ],
)
def test_bearer_token(header: str, token: str | None) -> None:
    assert bearer_token(header) == token
