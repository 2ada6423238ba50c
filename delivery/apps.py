from django.apps import AppConfig


class DeliveryConfig(AppConfig):
    name = "delivery"

    def ready(self) -> None:
        from delivery import metrics, signals  # noqa: F401  (signals connects the receivers)

        metrics.register()
