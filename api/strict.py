"""Request bodies as the OpenAPI document states them, and nothing looser.

A field the serializer does not know is a 422 naming it: a typo ("wieght") is not a
request that silently changes nothing. And each value must be of the JSON type the
document gives its field: DRF would read 5 as the text "5", "true" as true and "24" as
24, so a client could send what the document calls invalid and have it pass, and a
client generated from the document could never rely on that. Also here: a decimal field
for JSON numbers."""

from decimal import ROUND_HALF_UP, Decimal

from rest_framework import serializers
from rest_framework.request import Request


class StrictSerializer(serializers.Serializer):
    def to_internal_value(self, data: object) -> dict:
        if isinstance(data, dict):
            writable = {name: field for name, field in self.fields.items() if not field.read_only}
            problems = {
                str(name): ["Not a field this operation takes."]
                for name in data
                if name not in writable
            }
            for name, value in data.items():
                wanted = _json_type_wanted(writable[name], value) if name in writable else None
                if wanted:
                    problems[str(name)] = [f"Must be {wanted}."]
            if problems:
                raise serializers.ValidationError(dict(sorted(problems.items())))
        return super().to_internal_value(data)


class StrictModelSerializer(StrictSerializer, serializers.ModelSerializer):
    pass


def _json_type_wanted(field: serializers.Field, value: object) -> str | None:
    """What `value` should have been for `field`, or None when it is of the right type
    (a null is left to the field, which knows whether it allows one)."""
    if value is None or isinstance(field, serializers.JSONField):
        return None
    if isinstance(field, serializers.ChoiceField):
        kinds = {_kind(choice) for choice in field.choices}
        return None if _kind(value) in kinds else "one of the choices"
    if isinstance(field, serializers.BooleanField):
        return None if isinstance(value, bool) else "true or false"
    if isinstance(field, serializers.IntegerField):
        whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        return None if whole and not isinstance(value, bool) else "a whole number"
    if isinstance(field, serializers.DecimalField | serializers.FloatField):
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return None if number else "a number"
    if isinstance(field, serializers.CharField | serializers.DateTimeField):
        return None if isinstance(value, str) else "text"
    if isinstance(field, serializers.ListField):
        if not isinstance(value, list):
            return "a list"
        wrong = [_json_type_wanted(field.child, item) for item in value]
        return next((f"a list, each item {kind}" for kind in wrong if kind), None)
    return None


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "string" if isinstance(value, str) else type(value).__name__


class RoundedDecimalField(serializers.DecimalField):
    """A decimal kept to `decimal_places`, rounded rather than refused: a JSON number is a
    binary float, and 0.1 + 0.2 arrives as 0.30000000000000004. The bounds apply to the
    number as sent, as the document states them (10000.0004 is above 10000, even though it
    rounds to it); too many whole digits is a 422 before rounding, which would overflow."""

    def validate_precision(self, value: Decimal) -> Decimal:
        self._check_whole_digits(value)
        if self.max_value is not None and value > self.max_value:
            self.fail("max_value", max_value=self.max_value)
        if self.min_value is not None and value < self.min_value:
            self.fail("min_value", min_value=self.min_value)
        rounded = value.quantize(Decimal(1).scaleb(-self.decimal_places), rounding=ROUND_HALF_UP)
        self._check_whole_digits(rounded)
        return rounded.copy_abs() if rounded == 0 else rounded  # no "-0.000"

    def _check_whole_digits(self, value: Decimal) -> None:
        _, digits, exponent = value.as_tuple()
        if self.max_whole_digits is not None and len(digits) + exponent > self.max_whole_digits:
            self.fail("max_whole_digits", max_whole_digits=self.max_whole_digits)


QUERY_BOOLEANS = {"true": True, "false": False}


def query_flag(request: Request, name: str) -> bool:
    """A boolean query parameter as the document states it: absent is false, and only
    "true" or "false" are values (a 422 names anything else, "" and "1" too)."""
    raw = request.query_params.get(name)
    if raw is None:
        return False
    if raw not in QUERY_BOOLEANS:
        raise serializers.ValidationError({name: ['"true" or "false".']})
    return QUERY_BOOLEANS[raw]
