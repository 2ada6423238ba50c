"""Strict readers for settings that come from the environment.

A malformed value stops start-up with a message naming the variable: a typo in
production must not silently fall back to a default.
"""

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from django.core.exceptions import ImproperlyConfigured

T = TypeVar("T")

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _read(name: str, default: T, parse: Callable[[str], T], expected: str) -> T:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return parse(raw.strip())
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"{name}={raw!r} is not valid: expected {expected}.") from exc


def env_str(name: str, default: str = "") -> str:
    return _read(name, default, str, "a string")


def env_bool(name: str, default: bool) -> bool:
    def parse(raw: str) -> bool:
        lowered = raw.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ValueError(raw)

    return _read(name, default, parse, "one of true/false, 1/0, yes/no, on/off")


def env_choice(name: str, default: str, choices: dict[str, str]) -> str:
    """One of `choices`' values, named by any of its keys (case-insensitive): several
    spellings may mean one value (a setting that was a boolean keeps its old ones)."""

    def parse(raw: str) -> str:
        if raw.lower() not in choices:
            raise ValueError(raw)
        return choices[raw.lower()]

    spellings: dict[str, list[str]] = {}
    for spelling, value in choices.items():
        spellings.setdefault(value, []).append(spelling)
    expected = "one of " + "; ".join("/".join(names) for names in spellings.values())
    return _read(name, default, parse, expected)


def env_int(
    name: str, default: int, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    def parse(raw: str) -> int:
        value = int(raw)
        if minimum is not None and value < minimum:
            raise ValueError(raw)
        if maximum is not None and value > maximum:
            raise ValueError(raw)
        return value

    bounds = (
        f" between {minimum} and {maximum}"
        if maximum is not None
        else (f" of at least {minimum}" if minimum is not None else "")
    )
    return _read(name, default, parse, f"a whole number{bounds}")


def env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    def parse(raw: str) -> float:
        value = float(raw)
        if value != value or value < minimum:  # NaN or below the floor
            raise ValueError(raw)
        return value

    return _read(name, default, parse, f"a number of at least {minimum}")


def env_list(name: str, default: list[str]) -> list[str]:
    def parse(raw: str) -> list[str]:
        items = [item.strip() for item in raw.split(",")]
        if any(not item for item in items):
            raise ValueError(raw)
        return items

    return _read(name, default, parse, "a comma-separated list with no empty items")


def env_float_list(name: str, default: list[float]) -> list[float]:
    def parse(raw: str) -> list[float]:
        values = [float(item) for item in raw.split(",")]
        if not values or any(v != v or v < 0 for v in values):
            raise ValueError(raw)
        return values

    return _read(name, default, parse, "a comma-separated list of non-negative numbers")


def secret_from_file_or_env(name: str) -> str:
    """`NAME_FILE` (a path, e.g. a mounted secret) wins over `NAME`."""
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        try:
            return Path(file_path).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={file_path!r} cannot be read: {exc}") from exc
    return os.environ.get(name, "")
