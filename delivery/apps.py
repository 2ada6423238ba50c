from django.apps import AppConfig


class DeliveryConfig(AppConfig):
    name = "delivery"

    def ready(self) -> None:
        from delivery.upkeep import signals  # noqa: F401  (connects the receivers)
