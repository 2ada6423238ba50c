"""Signals the tenants app sends; apps above it connect to them (it imports none of them).

`endpoint_enabled`: an operator re-enabled an endpoint (`Endpoint.enable`). Receivers
resume the work held while it was disabled and return how many deliveries they resumed,
so the admin can say so.
"""

from django.dispatch import Signal

endpoint_enabled = Signal()
