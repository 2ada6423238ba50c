"""
WSGI config for webhooks project.

It exposes the WSGI callable as a module-level variable named ``application``.

For more information on this file, see
https://docs.djangoproject.com/en/5.2/howto/deployment/wsgi/
"""

import os

from core import tracing
from project import launch, machine_doors

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
# A web server left to its own devices (no REDIS_URL) starts the embedded Redis and leaves
# it running for the worker processes beside it; production sets REDIS_URL.
launch.prepare_files()
launch.start_embedded_redis()
# Before the handler loads its middleware: the Django instrumentation adds one.
tracing.configure_from_environment()

application = machine_doors.get_wsgi_application()
