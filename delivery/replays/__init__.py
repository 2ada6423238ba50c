"""Sending finished or waiting deliveries again, always through the tenant's own lane.

`resend` (one delivery, or dead letters), `window` (a paced replay of a time window),
`forms` (the window form the admin and the portal share), `retry_now` (an operator's
"retry now" for a delivery waiting for its next retry).
"""
