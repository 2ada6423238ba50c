"""The delivery app's admin: the history lists, a delivery's page, window replays."""

from delivery.admin import deliveries  # noqa: F401  (registers the ModelAdmins)
