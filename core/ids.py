"""Time-ordered identifiers (ULIDs) for events and deliveries.

A ULID's first 10 characters are its creation time in milliseconds, so the age of
the head of a Redis lane can be read from the id alone, without a lookup, and ids
sort by arrival.
"""

import os
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford base32
_DECODE = {char: index for index, char in enumerate(_ALPHABET)}
ULID_LENGTH = 26
# Two characters per 10 bits: a ULID's 128 bits are its first two characters (the top 3
# and the next 5 bits) and then 12 pairs. Half the steps of one character at a time, which
# costs: a publish batch of 500 events makes 1,000 ids or more (docs/INGEST.md).
_PAIRS = [first + second for first in _ALPHABET for second in _ALPHABET]
_PAIR_SHIFTS = tuple(range(110, -1, -10))


def _encode(value: int) -> str:
    """The 26 characters of a 128-bit value, most significant first."""
    pairs = _PAIRS
    return (
        _ALPHABET[value >> 125]
        + _ALPHABET[(value >> 120) & 31]
        + "".join([pairs[(value >> shift) & 1023] for shift in _PAIR_SHIFTS])
    )


# The millisecond last encoded and its 10 characters: ids come in runs of one
# millisecond (a batch's 1,000), and the time's characters are a ULID's own, aligned.
_last_time: tuple[int, str] = (-1, "")


def new_ulid(now_ms: int | None = None) -> str:
    """A ULID of `now_ms` (default: now) and 80 random bits. The time's 10 characters are
    kept from the last call, and the 80 bits are 8 pairs written out: cheaper than
    _encode of the whole value, for every id a batch makes (docs/INGEST.md)."""
    global _last_time
    timestamp = int(time.time() * 1000) if now_ms is None else now_ms
    kept_ms, prefix = _last_time  # one tuple: another thread's update is whole or absent
    if timestamp != kept_ms:
        prefix = _encode(timestamp << 80)[:10]
        _last_time = (timestamp, prefix)
    bits = int.from_bytes(os.urandom(10), "big")
    pairs = _PAIRS
    return (
        prefix
        + pairs[bits >> 70]
        + pairs[(bits >> 60) & 1023]
        + pairs[(bits >> 50) & 1023]
        + pairs[(bits >> 40) & 1023]
        + pairs[(bits >> 30) & 1023]
        + pairs[(bits >> 20) & 1023]
        + pairs[(bits >> 10) & 1023]
        + pairs[bits & 1023]
    )


def ulid_time_ms(ulid: str) -> int:
    """Milliseconds since the epoch encoded in the first 10 characters."""
    value = 0
    for char in ulid[:10].upper():
        value = (value << 5) | _DECODE[char]
    return value


def ulid_floor(now_ms: int) -> str:
    """The smallest ULID of millisecond `now_ms`: ids made at or after it sort >= this one,
    so a time range becomes a range of primary keys (an index every table has)."""
    return _encode(now_ms << 80)


def is_base32(text: str) -> bool:
    """Whether every character of `text` is Crockford base32, as a ULID's are."""
    return all(char in _DECODE for char in text.upper())


def looks_like_ulid(text: str) -> bool:
    """Whether `text` could be an id of ours (26 Crockford base32 characters): the admin's
    searches then look it up by index instead of matching it against every field."""
    return len(text) == ULID_LENGTH and is_base32(text)
