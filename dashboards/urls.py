"""Tenant dashboards: /t/<key>/ for members, /t/<key>/s/<token>/ through a share link."""

from django.contrib.auth import views as auth_views
from django.urls import path, re_path, reverse_lazy

from dashboards import audit_views, endpoint_views, message_views, replays, views

app_name = "tenants"

# A tenant key is any fairness-key value without a slash (shop domains, account ids).
KEY = r"(?P<key>[^/]+)"
# django.core.signing output: URL-safe base64 and colons.
SIGNED = r"(?P<token>[A-Za-z0-9_:\-]+)"
CHART = r"(?P<name>[a-z-]+)"
ENDPOINT = r"(?P<endpoint_id>[0-9]{1,18})"
# ULIDs (core.ids): a malformed id is a 404 before any lookup.
EVENT = r"(?P<event_id>[0-9A-HJKMNP-TV-Z]{26})"
DELIVERY = r"(?P<delivery_id>[0-9A-HJKMNP-TV-Z]{26})"

urlpatterns = [
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(
            template_name="dashboards/login.html", next_page=reverse_lazy("tenants:home")
        ),
        name="login",
    ),
    path(
        "accounts/logout/",
        auth_views.LogoutView.as_view(next_page=reverse_lazy("tenants:login")),
        name="logout",
    ),
    path("t/", views.home, name="home"),
    re_path(rf"^t/{KEY}/$", views.dashboard, name="dashboard"),
    re_path(rf"^t/{KEY}/status\.json$", views.status_json, name="status"),
    re_path(rf"^t/{KEY}/charts/{CHART}\.svg$", views.chart_svg, name="chart"),
    # The portal's endpoint and audit pages: members only, never through a share link.
    re_path(rf"^t/{KEY}/endpoints/$", endpoint_views.endpoint_list, name="endpoints"),
    re_path(rf"^t/{KEY}/endpoints/new/$", endpoint_views.endpoint_new, name="endpoint-new"),
    re_path(rf"^t/{KEY}/endpoints/{ENDPOINT}/$", endpoint_views.endpoint_detail, name="endpoint"),
    re_path(
        rf"^t/{KEY}/endpoints/{ENDPOINT}/disable/$",
        endpoint_views.endpoint_disable,
        name="endpoint-disable",
    ),
    re_path(
        rf"^t/{KEY}/endpoints/{ENDPOINT}/enable/$",
        endpoint_views.endpoint_enable,
        name="endpoint-enable",
    ),
    re_path(
        rf"^t/{KEY}/endpoints/{ENDPOINT}/secret/reveal/$",
        endpoint_views.secret_reveal,
        name="endpoint-secret-reveal",
    ),
    re_path(
        rf"^t/{KEY}/endpoints/{ENDPOINT}/secret/rotate/$",
        endpoint_views.secret_rotate,
        name="endpoint-secret-rotate",
    ),
    re_path(
        rf"^t/{KEY}/endpoints/{ENDPOINT}/secret/shown/$",
        endpoint_views.secrets_shown,
        name="endpoint-secrets-shown",
    ),
    re_path(
        rf"^t/{KEY}/endpoints/{ENDPOINT}/test/$", endpoint_views.send_test, name="endpoint-test"
    ),
    re_path(
        rf"^t/{KEY}/endpoints/{ENDPOINT}/deliveries/{DELIVERY}/$",
        endpoint_views.endpoint_delivery,
        name="endpoint-delivery",
    ),
    re_path(rf"^t/{KEY}/audit/$", audit_views.audit_trail, name="audit"),
    # The message log is for members only: no share-link (…/s/<token>/…) form exists.
    re_path(rf"^t/{KEY}/messages/$", message_views.message_log, name="messages"),
    re_path(rf"^t/{KEY}/messages/{EVENT}/$", message_views.message_detail_view, name="message"),
    re_path(
        rf"^t/{KEY}/messages/{EVENT}/deliveries/{DELIVERY}/resend/$",
        message_views.resend_delivery,
        name="resend",
    ),
    # No share-link variant: replays are for members only.
    re_path(rf"^t/{KEY}/replays/$", replays.replays, name="replays"),
    re_path(
        rf"^t/{KEY}/replays/(?P<job_id>[0-9]{{1,18}})/cancel/$",
        replays.cancel,
        name="replay-cancel",
    ),
    re_path(rf"^t/{KEY}/s/{SIGNED}/$", views.dashboard, name="shared"),
    re_path(rf"^t/{KEY}/s/{SIGNED}/status\.json$", views.status_json, name="shared-status"),
    re_path(rf"^t/{KEY}/s/{SIGNED}/charts/{CHART}\.svg$", views.chart_svg, name="shared-chart"),
]
