"""Placeholder: routes land here."""

urlpatterns: list = []
