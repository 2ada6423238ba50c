from django.apps import AppConfig


class IngestConfig(AppConfig):
    name = "ingest"

    def ready(self) -> None:
        from ingest import operational  # noqa: F401  (publishes what lower layers announce)
