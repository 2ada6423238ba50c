"""What the OpenAPI document says beyond what drf-spectacular infers: every error an
operation can give, as a problem (api.problems), so that a client generated from the
document, and schemathesis, expect exactly what the API answers."""

from django.core.validators import ProhibitNullCharactersValidator
from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiSerializerExtension
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers

from api.problems import MEDIA_TYPE, Problem

ERROR_TEXT = {
    400: "The request could not be read (not JSON, a bad header).",
    401: "No token, or a token that is not valid.",
    403: "The token may not do this (read-only, publish-only, or not an operator's).",
    404: "Nothing with this key or id that the token may see.",
    405: "The method is not allowed here.",
    409: "The request conflicts with the current state.",
    415: "The body is not JSON.",
    422: "The fields listed in errors are wrong.",
    429: "Too many requests: wait Retry-After seconds.",
    503: "The database is unavailable: retry after Retry-After seconds.",
}
# Every operation can answer these: no token, a throttled token, a database away.
ALWAYS = (400, 401, 403, 405, 415, 429, 503)


def errors(*codes: int) -> dict[int, OpenApiResponse]:
    """The `responses` entries for `codes` and the ones every operation can give."""
    return {
        code: OpenApiResponse(Problem, description=ERROR_TEXT[code])
        for code in sorted({*ALWAYS, *codes})
    }


def problems_as_problem_json(result: dict, generator, request, public) -> dict:
    """drf-spectacular's POSTPROCESSING_HOOKS: error answers are application/problem+json."""
    for path_item in result.get("paths", {}).values():
        for operation in path_item.values():
            for code, response in operation.get("responses", {}).items():
                content = response.get("content")
                if not str(code).startswith(("4", "5")) or not content:
                    continue
                schema = next(iter(content.values()))["schema"]
                response["content"] = {MEDIA_TYPE: {"schema": schema}}
    return result


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """Registered on import (api.apps): the document's bearerAuth security scheme."""

    target_class = "api.auth.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: object) -> dict:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token (whp_…): `manage.py create_api_token` or the admin.",
        }


class StrictBodies(OpenApiSerializerExtension):
    """Registered on import (api.apps): a request body read by an api.strict serializer
    says additionalProperties: false, since an unknown field is a 422, not ignored, and
    its text fields say what DRF refuses in any text: the NUL character."""

    target_class = "api.strict.StrictSerializer"
    match_subclasses = True

    def map_serializer(self, auto_schema, direction: str) -> dict:
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        properties = schema.get("properties", {})
        for name, field in self.target.fields.items():
            shown = properties.get(name)
            if isinstance(field, serializers.ListField) and shown is not None:
                field, shown = field.child, shown.get("items")
            if _refuses_nul(field) and shown is not None and "pattern" not in shown:
                shown["pattern"] = NO_NUL
        return {**schema, "additionalProperties": False}


NO_NUL = "^[^\\x00]*$"


def _refuses_nul(field: serializers.Field) -> bool:
    return isinstance(field, serializers.CharField) and any(
        isinstance(validator, ProhibitNullCharactersValidator) for validator in field.validators
    )
