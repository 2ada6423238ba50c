"""django-rq's pages only for operators allowed to manage the job queues.

django-rq 4.2 guards its views with staff_member_required alone and has no setting to
ask for more, so any staff user could empty or requeue a queue. Its own permission,
django_rq.admin ("Access admin page", on its Dashboard model), only decides whether the
admin index lists it. Here every one of its views, at /admin/django-rq/ and inside the
admin at /admin/django_rq/dashboard/, requires that permission too: staff without it get
403 (as on the operations overview), anyone not staff the admin's login page, and
superusers have every permission. The API views (stats.json, metrics) are gated alike:
the platform's own /metrics is what monitoring reads.
"""

import importlib.util
from collections.abc import Callable
from functools import wraps

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import URLPattern
from django_rq.admin import QueueAdmin
from django_rq.connection_utils import get_unique_connection_configs
from django_rq.models import Dashboard
from django_rq.queues import get_queue_by_index
from django_rq.settings import get_queues_list
from rq import Worker
from rq.exceptions import NoSuchJobError

PERMISSION = "django_rq.admin"
# URL arguments that index a list (its length): past its end django-rq raises IndexError
# (a 500), as it lets NoSuchJobError out of a job's delete, requeue and enqueue pages.
INDEXES: dict[str, Callable[[], int]] = {
    "queue_index": lambda: len(get_queues_list()),
    "connection_index": lambda: len(get_unique_connection_configs()),
}

View = Callable[..., HttpResponse]


def _missing(kwargs: dict[str, object]) -> str | None:
    """What the URL names that does not exist (django-rq answers 500 to these), or None."""
    if any(int(kwargs[name]) >= size() for name, size in INDEXES.items() if name in kwargs):
        return "No such queue or connection."
    if "scheduler_index" in kwargs and importlib.util.find_spec("rq_scheduler") is None:
        return "No scheduler: rq-scheduler is not installed (the platform does not use it)."
    if "key" in kwargs:  # a worker's page: django-rq asserts the worker exists
        connection = get_queue_by_index(int(kwargs["queue_index"])).connection
        try:
            if Worker.find_by_key(str(kwargs["key"]), connection=connection) is None:
                return "No such worker."
        except ValueError:  # not even shaped like a worker key
            return "No such worker."
    return None


def require_queue_permission(view: View) -> View:
    """`view` for active staff with PERMISSION; an unknown queue or job is a 404."""

    @wraps(view)
    def checked(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        if not request.user.has_perm(PERMISSION):
            raise PermissionDenied
        missing = _missing(kwargs)
        if missing is not None:
            raise Http404(missing)
        try:
            return view(request, *args, **kwargs)
        except NoSuchJobError as exc:
            raise Http404("No such job.") from exc

    # The admin's own check first: anyone not active staff goes to its login page.
    return admin.site.admin_view(checked)


def gated(patterns: list[URLPattern]) -> list[URLPattern]:
    """The same URL patterns, each view behind require_queue_permission."""
    return [
        URLPattern(p.pattern, require_queue_permission(p.callback), p.default_args, p.name)
        for p in patterns
    ]


class GatedQueueAdmin(QueueAdmin):
    """django-rq's admin entry, its pages behind the same permission."""

    def get_urls(self) -> list[URLPattern]:
        return gated(super().get_urls())


def gate_admin_entry(site: admin.AdminSite = admin.site) -> None:
    """Swap django-rq's own admin registration (RQ_SHOW_ADMIN_LINK) for the gated one;
    called before the admin's URLs are built."""
    if site.is_registered(Dashboard):
        site.unregister(Dashboard)
        site.register(Dashboard, GatedQueueAdmin)
