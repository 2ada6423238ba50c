"""The shapes of the API's paths, shared by the modules that route to their views."""

from django.urls import URLPattern, re_path

KEY = r"(?P<key>[^/]+)"  # a tenant key: any fairness-key value without a slash
ENDPOINT = rf"{KEY}/endpoints/(?P<endpoint_id>[0-9]{{1,18}})"
# ULIDs (core.ids): a malformed id is a 404 before any lookup.
ULID = r"[0-9A-HJKMNP-TV-Z]{26}"


def tenant_route(pattern: str, view: type, name: str) -> URLPattern:
    """/api/v1/tenants/<pattern>, no trailing slash."""
    return re_path(rf"^api/v1/tenants/{pattern}$", view.as_view(), name=name)
