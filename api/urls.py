"""/api/v1/: the management API's routes and its OpenAPI document. Publishing
(POST /api/v1/events) stays in ingest.api, on the same tokens."""

from csp.constants import UNSAFE_INLINE
from csp.decorators import csp_update
from django.urls import path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView

from api import endpoints, event_types, messages, portal_links, problems, replays, tenants
from api.routes import ENDPOINT, KEY, tenant_route

urlpatterns = [
    path(
        "api/v1/openapi.json",
        SpectacularAPIView.as_view(
            authentication_classes=[], permission_classes=[], throttle_classes=[]
        ),
        {"format": "json"},
        name="api-schema",
    ),
    path(
        "api/v1/docs",
        # ReDoc writes its styles as <style> elements (styled-components) with data: icons,
        # and searches in a worker made from a blob. The page holds the public document
        # only: no data, no forms, and still no inline script.
        csp_update({"style-src": [UNSAFE_INLINE], "img-src": ["data:"], "worker-src": ["blob:"]})(
            SpectacularRedocView.as_view(
                url_name="api-schema",
                template_name="api/redoc.html",
                authentication_classes=[],
                permission_classes=[],
                throttle_classes=[],
            )
        ),
        name="api-docs",
    ),
    path("api/v1/tenants", tenants.TenantList.as_view(), name="api-tenants"),
    tenant_route(KEY, tenants.TenantDetail, "api-tenant"),
    tenant_route(rf"{KEY}/endpoints", endpoints.EndpointList, "api-endpoints"),
    tenant_route(ENDPOINT, endpoints.EndpointDetail, "api-endpoint"),
    tenant_route(rf"{ENDPOINT}/disable", endpoints.EndpointDisable, "api-endpoint-disable"),
    tenant_route(rf"{ENDPOINT}/enable", endpoints.EndpointEnable, "api-endpoint-enable"),
    tenant_route(rf"{ENDPOINT}/secrets", endpoints.SecretList, "api-endpoint-secrets"),
    tenant_route(rf"{ENDPOINT}/secrets/reveal", endpoints.SecretReveal, "api-secrets-reveal"),
    tenant_route(rf"{ENDPOINT}/secrets/rotate", endpoints.SecretRotate, "api-secrets-rotate"),
    tenant_route(rf"{ENDPOINT}/stats", endpoints.EndpointStats, "api-endpoint-stats"),
    tenant_route(rf"{ENDPOINT}/test", endpoints.TestEvent, "api-endpoint-test"),
    *messages.urlpatterns,
    *replays.urlpatterns,
    *portal_links.urlpatterns,
    *event_types.urlpatterns,
]

# Last: any other path under /api/v1/ is a problem, not the site's HTML 404 page.
fallback = [re_path(r"^api/v1/", problems.not_found)]
