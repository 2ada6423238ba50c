from django.apps import AppConfig


class DashboardsConfig(AppConfig):
    """The read side: the operators' overview, the tenants' own pacing dashboards and
    what they compute (pacing), over everything below it (docs/ARCHITECTURE.md)."""

    name = "dashboards"
