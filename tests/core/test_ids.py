"""ULIDs: the encoding is Crockford base32 of (48-bit ms << 80 | 80 random bits), most
significant first, checked against the definition one character at a time."""

import random

import pytest

from core.ids import ULID_LENGTH, _encode, new_ulid, ulid_floor, ulid_time_ms

ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def by_definition(value: int) -> str:
    """Five bits per character, from the least significant end."""
    chars = []
    for _ in range(ULID_LENGTH):
        chars.append(ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


@pytest.mark.parametrize("value", [0, 1, 31, 32, 1023, 1024, 2**80, 2**125, 2**128 - 1])
def test_edge_values_encode_as_the_definition_says(value):
    assert _encode(value) == by_definition(value)


def test_random_values_encode_as_the_definition_says():
    rng = random.Random(21)
    for _ in range(20_000):
        value = rng.getrandbits(128)
        assert _encode(value) == by_definition(value)


def test_a_new_ulid_carries_its_time_and_sorts_after_the_floor_of_its_millisecond():
    now_ms = 1_796_457_804_030
    ulid = new_ulid(now_ms)

    assert len(ulid) == ULID_LENGTH and set(ulid) <= set(ALPHABET)
    assert ulid_time_ms(ulid) == now_ms
    assert ulid_floor(now_ms) <= ulid < ulid_floor(now_ms + 1)
    assert ulid_floor(now_ms) == by_definition(now_ms << 80)


def test_ids_of_later_milliseconds_sort_later():
    ids = [new_ulid(ms) for ms in range(1_700_000_000_000, 1_700_000_000_050)]

    assert ids == sorted(ids)
    assert len(set(new_ulid(1_700_000_000_000) for _ in range(1_000))) == 1_000


def test_a_new_ulid_is_its_time_and_random_bits_as_the_definition_says(monkeypatch):
    """new_ulid writes the time's characters (kept from the last call) and the 80 random
    bits apart: together they must be the definition's encoding of the whole value."""
    rng = random.Random(22)
    times = [rng.getrandbits(48) for _ in range(50)] + [0, 2**48 - 1]
    for now_ms in times:
        for bits in (0, 2**80 - 1, rng.getrandbits(80), rng.getrandbits(80)):
            monkeypatch.setattr("os.urandom", lambda n, bits=bits: bits.to_bytes(n, "big"))
            assert new_ulid(now_ms) == by_definition((now_ms << 80) | bits), (now_ms, bits)
