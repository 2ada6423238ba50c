"""What the fuzzers send: the shapes internet input takes, odd ones first. FUZZ_EXAMPLES
sets how many examples each property tries (CI's default keeps the whole suite near a
minute; docs/RELIABILITY.md, "Security", gives the longer run's command)."""

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "80")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=os.environ.get("FUZZ_SEED") is None and os.environ.get("CI") is not None,
)

# A header value as WSGI hands it over: each byte one Latin-1 character. UTF-8 text, bytes
# that are not UTF-8, controls and the empty string all arrive this way.
header_values = st.one_of(
    st.text(max_size=40).map(lambda text: text.encode("utf-8").decode("latin-1")),
    st.binary(max_size=40).map(lambda raw: raw.decode("latin-1")),
    st.sampled_from(["", " ", "shop-1", "магазин.example", "a" * 300, "\t", "0", "-1"]),
).filter(lambda value: "\n" not in value and "\r" not in value)

# Any JSON value, weighted towards the shapes the code looks into.
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**20, max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["tenant", "event_type", "payload", "shop_id", "shop", "id", "events"])
            | st.text(max_size=8),
            children,
            max_size=5,
        )
    ),
    max_leaves=25,
)

# Raw bodies: random bytes, JSON documents, and JSON with the oddities strict parsing
# refuses (duplicate keys, NaN, deep nesting, a BOM, trailing garbage).
json_bodies = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda value: __import__("json").dumps(value).encode()),
    st.sampled_from(
        [
            b'{"shop_id": "a", "shop_id": "b"}',
            b'{"shop_id": NaN}',
            b"[" * 5000 + b"]" * 5000,
            b'\xef\xbb\xbf{"shop_id": "bom"}',
            b'{"shop_id": "x"} trailing',
            b'{"shop_id": "\\ud800"}',
            b'{"shop_id": 1e400}',
            b'{"shop_id": ' + b"9" * 5000 + b"}",
        ]
    ),
)
