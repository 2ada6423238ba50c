from django.contrib import admin
from django.urls import include, path, re_path
from django_rq import urls as rq_urls

from api import urls as api_urls
from dashboards import landing
from dashboards import overview as admin_overview
from dashboards.exporter import metrics
from ingest import api, views
from project import rq_gate
from project.two_factor import pages as two_factor_pages

admin.site.site_header = "Fair webhooks: operations"
admin.site.site_title = "Fair webhooks"
# The model list is on the index and a breadcrumb away; beside a changelist's filters it
# would leave a laptop's window little room for the table.
admin.site.enable_nav_sidebar = False
rq_gate.gate_admin_entry()

urlpatterns = [
    # The trailing slash is optional: a redirect would lose the POST body.
    re_path(r"^ingest/(?P<slug>[-\w]+)/?$", views.ingest, name="ingest"),
    re_path(r"^ingest/(?P<slug>[-\w]+)/(?P<path>.+)$", views.ingest, name="ingest-path"),
    path("api/v1/events", api.publish_events, name="publish-events"),
    *api_urls.urlpatterns,
    *api_urls.fallback,
    # Emptying or requeueing a queue needs django_rq.admin, not just staff (project.rq_gate).
    path("admin/django-rq/", include((rq_gate.gated(rq_urls.urlpatterns), rq_urls.app_name))),
    # Before admin.site.urls, whose catch-all would answer /admin/overview/ with a 404.
    *admin_overview.urlpatterns,
    path("admin/2fa/", two_factor_pages.check, name="two-factor"),
    path("admin/2fa/enrol/", two_factor_pages.enrol, name="two-factor-enrol"),
    path(
        "admin/2fa/recovery-codes/",
        two_factor_pages.recovery_codes,
        name="two-factor-recovery-codes",
    ),
    path("admin/", admin.site.urls),
    path("metrics", metrics, name="metrics"),
    # The admin's "View site" and a bare host name: the way to the admin or a dashboard.
    path("", landing.landing, name="root"),
    # Tenant dashboards (/t/<key>/) and the login page tenants use (not the admin's).
    path("", include("dashboards.urls")),
]
