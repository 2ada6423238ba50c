"""Ingest: the doors events come in by (signed provider webhooks, the publish API), and
the fan-out of each accepted event into deliveries. It sits above `delivery` (it creates
and enqueues deliveries) and below the read side; nothing under it imports it."""
