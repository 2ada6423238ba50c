"""The WSGI application: the machine doors (/ingest/, /api/v1/) on a lighter
middleware stack than the pages people use, and the health probes (project.health) on
none at all.

Providers and publishers bring a signature or a bearer token, never a cookie: sessions,
CSRF (the views are exempt anyway), authentication, messages, the viewer's time zone and
frame options do nothing for them but cost CPU on every request, and ingest is where
requests arrive in the greatest numbers (the figures are in docs/INGEST.md).
The same URL map, views and error handling serve both stacks; only the middleware list
differs (settings.MACHINE_MIDDLEWARE, a subset of settings.MIDDLEWARE in the same order).
"""

from collections.abc import Callable, Iterable

import django
from django.conf import settings
from django.core.handlers.wsgi import WSGIHandler

MACHINE_PREFIXES = ("/ingest/", "/api/v1/")
TRACING_MIDDLEWARE = "opentelemetry.instrumentation.django."


class _MachineHandler(WSGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        # Django builds a handler's chain from settings.MIDDLEWARE and takes no list of
        # its own: the machine list stands in for it while this one handler is built,
        # once, at start-up, before any request is served.
        full = settings.MIDDLEWARE
        # Tracing's middleware (core.tracing; the Django instrumentation puts it first in
        # settings.MIDDLEWARE) makes each request's server span: the machine doors'
        # requests are the ones traced from end to end, so they keep it.
        traced = [name for name in full if name.startswith(TRACING_MIDDLEWARE)]
        settings.MIDDLEWARE = [*traced, *settings.MACHINE_MIDDLEWARE]
        try:
            super().load_middleware(is_async)
        finally:
            settings.MIDDLEWARE = full


class MachineDoorsDispatcher:
    """Requests to the machine doors go to the light stack, every other to the full one."""

    def __init__(self) -> None:
        from project import health  # it reads models: only once Django is set up

        self.full = WSGIHandler()
        self.machine = _MachineHandler()
        self.health = health

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in self.health.PATHS:
            return self.health.serve(environ, start_response)
        handler = self.machine if path.startswith(MACHINE_PREFIXES) else self.full
        return handler(environ, start_response)


def get_wsgi_application() -> MachineDoorsDispatcher:
    """Django's get_wsgi_application(), with the machine doors on their own stack."""
    django.setup(set_prefix=False)
    return MachineDoorsDispatcher()
