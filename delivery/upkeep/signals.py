"""Keep the schedule in step with what operators change in the admin.

Weights, pauses, caps and rates live in the database; the scheduler keeps a copy for its
Lua scripts. A failed update is logged and repaired by the next enqueue (items carry
weights, caps and rates) or by a rebuild.
"""

import logging

import redis
from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

from delivery.pipeline.endpoint_health import release_held
from delivery.scheduler import get_scheduler
from tenants.models import Endpoint, Tenant
from tenants.signals import endpoint_enabled

logger = logging.getLogger(__name__)


def _after_commit(action, what: str) -> None:
    def run() -> None:
        try:
            action()
        except redis.RedisError as exc:
            logger.warning("could not update the schedule for %s: %s", what, exc)

    transaction.on_commit(run)


@receiver(post_save, sender=Tenant)
def tenant_saved(sender, instance: Tenant, **kwargs) -> None:
    _after_commit(
        lambda: get_scheduler().set_tenant(
            instance.pk,
            weight=instance.weight,
            paused=not instance.is_active,
            rate_per_second=instance.effective_rate_per_second(),
        ),
        f"tenant {instance.key}",
    )


@receiver(post_save, sender=Endpoint)
def endpoint_saved(sender, instance: Endpoint, created: bool, **kwargs) -> None:
    _after_commit(
        lambda: get_scheduler().set_endpoint(
            instance.pk,
            max_in_flight=instance.in_flight_cap,
            retry_max_in_flight=instance.retry_max_in_flight,
            rate_per_second=instance.effective_rate_per_second(),
            adaptive=instance.adapts_concurrency,
        ),
        f"endpoint {instance.pk}",
    )
    if instance.enabled and not created:
        release_held(instance)


@receiver(endpoint_enabled)
def resume_held(sender, endpoint: Endpoint, **kwargs) -> int:
    return release_held(endpoint)
