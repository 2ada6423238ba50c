"""Long URLs that wrap where a reader expects: after a slash, before a query or a
parameter, never inside a host unless the host alone is wider than its cell."""

import re

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

_BREAK_AFTER = re.compile(r"(//|/|\?|&|=)")


@register.filter
def breakable(value: object) -> SafeString:
    """The text escaped, with a <wbr> after each "/", "?", "&" and "=" (the same rule as
    breakable() in dashboards/static/tenants/dashboard.js)."""
    parts = _BREAK_AFTER.split(str(value or ""))
    return mark_safe(  # noqa: S308 (every part is escaped; only <wbr> is added)
        "".join(escape(part) + ("<wbr>" if _BREAK_AFTER.fullmatch(part) else "") for part in parts)
    )
