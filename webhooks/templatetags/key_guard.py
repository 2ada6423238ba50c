"""{% suspended_sources %}: the sources whose fairness-key guard tripped, for admin warnings."""

from django import template

from webhooks import key_hygiene
from webhooks.models import Source

register = template.Library()


@register.simple_tag
def suspended_sources() -> list[Source]:
    return key_hygiene.suspended_sources()
