from django.apps import AppConfig


class DashboardsConfig(AppConfig):
    """The read side: the operators' overview, the tenants' own pacing dashboards and
    what they compute (status, pacing), `lanes` and the Prometheus metrics, over everything below it (docs/ARCHITECTURE.md)."""

    name = "dashboards"

    def ready(self) -> None:
        from dashboards import metrics, pacing_news  # noqa: F401  (pacing_news listens)

        metrics.register()
