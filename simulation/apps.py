from django.apps import AppConfig


class SimulationConfig(AppConfig):
    """`manage.py simulate`: scenarios that drive the whole platform (ingest, scheduler,
    workers, a local receiver) and measure fairness. A tool on top of every layer."""

    name = "simulation"
    default_auto_field = "django.db.models.BigAutoField"
