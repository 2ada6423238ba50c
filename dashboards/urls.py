"""Tenant dashboards: /t/<key>/ for members, /t/<key>/s/<token>/ through a share link."""

from django.contrib.auth import views as auth_views
from django.urls import path, re_path, reverse_lazy

from dashboards import replays, views

app_name = "tenants"

# A tenant key is any fairness-key value without a slash (shop domains, account ids).
KEY = r"(?P<key>[^/]+)"
# django.core.signing output: URL-safe base64 and colons.
SIGNED = r"(?P<token>[A-Za-z0-9_:\-]+)"
CHART = r"(?P<name>[a-z-]+)"

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
