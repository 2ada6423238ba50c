from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    verbose_name = "Inbound webhooks"

    def ready(self) -> None:
        from webhooks import checks  # noqa: F401  (registers the deployment checks)
