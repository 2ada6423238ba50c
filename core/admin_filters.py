"""A list filter that is a text box instead of a list of links.

Django's list_filter on a foreign key lists every row of the other table: with thousands
of tenants that is a page of links (and a query for all of them) on every list view. An
exact value typed into a box costs one indexed lookup, and the filter still takes part
in the changelist's query string, so paging, sorting and other filters keep it.
"""

from typing import Any

from django.contrib import admin


class InputFilter(admin.SimpleListFilter):
    """Subclasses set title, parameter_name, help_text, and implement queryset()."""

    template = "admin/input_filter.html"
    help_text = ""
    placeholder = ""

    def lookups(self, request, model_admin) -> list[tuple[str, str]]:
        return []  # no links: the box is the whole filter

    def has_output(self) -> bool:
        return True

    def choices(self, changelist) -> list[dict[str, Any]]:
        # One "choice" carries what the template needs: the typed value, the other
        # parameters to keep as hidden inputs, and a link that clears this filter.
        others = {
            key: value
            for key, value in changelist.get_filters_params().items()
            if key != self.parameter_name
        }
        kept = [(key, item) for key, values in others.items() for item in _as_list(values)]
        for key in ("o", "q"):  # sorting and the search box are not filter parameters
            if key in changelist.params:
                kept += [(key, item) for item in _as_list(changelist.params[key])]
        return [
            {
                "value": self.value() or "",
                "kept": kept,
                "clear": changelist.get_query_string(remove=[self.parameter_name]),
                "parameter_name": self.parameter_name,
                "help_text": self.help_text,
                "placeholder": self.placeholder,
            }
        ]


def _as_list(value: object) -> list[object]:
    return list(value) if isinstance(value, list | tuple) else [value]
