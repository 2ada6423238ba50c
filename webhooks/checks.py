"""Deployment checks of our own, shown by `manage.py check --deploy`."""

from django.conf import settings
from django.core.checks import Tags, Warning, register


@register(Tags.security, deploy=True)
def production_settings(app_configs, **kwargs) -> list[Warning]:
    problems = []
    if getattr(settings, "SECRET_KEY_GENERATED", False):
        problems.append(
            Warning(
                "SECRET_KEY is the development key generated into var/.",
                hint="Set SECRET_KEY or SECRET_KEY_FILE in production.",
                id="webhooks.W001",
            )
        )
    if not settings.METRICS_TOKEN:
        problems.append(
            Warning(
                "/metrics is open to anyone who can reach the web server.",
                hint="Set METRICS_TOKEN (or METRICS_TOKEN_FILE) and give it to Prometheus.",
                id="webhooks.W002",
            )
        )
    if settings.ALLOW_PRIVATE_DESTINATIONS:
        problems.append(
            Warning(
                "ALLOW_PRIVATE_DESTINATIONS is on: endpoints may point at internal addresses.",
                hint="Turn it off in production unless every endpoint is trusted.",
                id="webhooks.W003",
            )
        )
    return problems
