"""Changelist cells that stay narrow, so an admin list fits a laptop's window.

A URL, a tenant key or a ULID has no space to wrap at: one long value widens its whole
column. These cells show a clipped value or a time in a few characters, with the whole
value in the title attribute (the browser shows it on hover, and search still matches
the full value).
"""

from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from core.ids import ULID_LENGTH, is_base32

ELLIPSIS = "…"
WORD_JOINER = "\u2060"  # keeps a leading ellipsis on its id's line


def clip(value: object, length: int, *, keep_end: bool = False) -> str:
    """`value` in at most `length` characters. `keep_end` keeps the tail instead of the
    head: a ULID's head is its timestamp, shared by rows made together; its tail differs."""
    text = "" if value is None else str(value)
    if len(text) <= length:
        return text
    shown = (
        ELLIPSIS + WORD_JOINER + text[1 - length :] if keep_end else text[: length - 1] + ELLIPSIS
    )
    return format_html('<span title="{}">{}</span>', text, shown)


def clipped_tail(term: str) -> str | None:
    """The tail of an id as a clipped cell shows it ("…⁠CGFEBDNA8F", pasted from the list),
    for a search to match ids that end with it; None for any other term."""
    term = term.strip()
    if not term.startswith(ELLIPSIS):
        return None
    tail = term.replace(ELLIPSIS, "").replace(WORD_JOINER, "").strip().upper()
    return tail if 4 <= len(tail) < ULID_LENGTH and is_base32(tail) else None


def when(moment: datetime | None, now: datetime | None = None) -> str | None:
    """Today's times as 14:03:07, this year's as Mar 9 14:03, older ones as a date; the
    title has the full time. None for no time (the admin shows its empty value)."""
    if moment is None:
        return None
    local, today = timezone.localtime(moment), timezone.localtime(now).date()
    if local.date() == today:
        short = f"{local:%H:%M:%S}"
    elif local.year == today.year:
        short = f"{local:%b} {local.day} {local:%H:%M}"
    else:
        short = f"{local:%Y-%m-%d}"
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        local.isoformat(),
        f"{local:%Y-%m-%d %H:%M:%S %Z}",
        short,
    )


def _follow(obj: object, path: str) -> Any:
    for name in path.split("__"):
        if obj is None:
            return None
        obj = getattr(obj, name)
    return obj


def _label(path: str) -> str:
    return path.split("__")[0].replace("_", " ")


def clipped(
    path: str, length: int, *, keep_end: bool = False, description: str | None = None
) -> Callable[[object], str]:
    """A list_display column: the attribute at `path` (a lookup such as endpoint__url),
    clipped to `length` characters and sortable by it."""

    @admin.display(description=description or _label(path), ordering=path)
    def cell(obj: object) -> str:
        return clip(_follow(obj, path), length, keep_end=keep_end)

    return cell


def timed(path: str, *, description: str | None = None) -> Callable[[object], str | None]:
    """A list_display column: the time at `path`, compact (see `when`), sortable by it."""

    @admin.display(description=description or _label(path), ordering=path)
    def cell(obj: object) -> str | None:
        return when(_follow(obj, path))

    return cell


def changelist_link(model: str, text: str, **lookups: object) -> str:
    """A link to `model`'s ("app_label.model") admin list filtered by `lookups`: how one
    admin page points at related rows of an app it may not import (the layers)."""
    app_label, name = model.split(".")
    url = reverse(f"admin:{app_label}_{name}_changelist")
    return format_html('<a href="{}?{}">{}</a>', url, urlencode(lookups), text)
