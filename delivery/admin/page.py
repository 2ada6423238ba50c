"""The delivery's own admin page: read-only evidence, with "Resend" and "Retry now" as
POST buttons on it. Kept out of delivery/admin/deliveries.py so DeliveryAdmin stays a list of
settings; DeliveryAdmin mixes this in."""

from collections.abc import Callable
from dataclasses import dataclass

from django.contrib import messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.urls import path, reverse

from delivery.models import Delivery
from delivery.replays.resend import RESENDABLE, resend
from delivery.replays.retry_now import RetryNow, retry_now
from tenants import audit
from tenants.models import AuditEntry

PERMISSION = "delivery.change_delivery"


@dataclass(frozen=True)
class PageAction:
    label: str
    url: str
    help: str


class DeliveryPageMixin:
    """For a ModelAdmin of Delivery. The change view is view-only for everyone (the
    admin's own has_change_permission(obj) is False there), so it shows no Save or Delete
    and refuses a POST; the buttons post to their own URLs instead."""

    def get_urls(self) -> list:
        wrap = self.admin_site.admin_view
        return [
            path(
                "<path:object_id>/resend/", wrap(self.resend_view), name="delivery_delivery_resend"
            ),
            path(
                "<path:object_id>/retry-now/",
                wrap(self.retry_now_view),
                name="delivery_delivery_retry_now",
            ),
            *super().get_urls(),
        ]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        delivery = self.get_object(request, unquote(object_id))
        context = {**(extra_context or {}), "title": f"Delivery {unquote(object_id)}"}
        if delivery is not None and request.user.has_perm(PERMISSION):
            context["delivery_actions"] = page_actions(delivery)
        return super().change_view(request, object_id, form_url, context)

    def resend_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._act(request, object_id, _resend)

    def retry_now_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._act(request, object_id, _retry_now)

    def _act(
        self,
        request: HttpRequest,
        object_id: str,
        act: Callable[[HttpRequest, Delivery], None],
    ) -> HttpResponse:
        # admin_view already checked staff and CSRF; the buttons change state, so POST only.
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"], "Use the buttons on the delivery's page.")
        if not request.user.has_perm(PERMISSION):
            raise PermissionDenied
        delivery = self.get_object(request, unquote(object_id))
        if delivery is None:
            raise Http404("No such delivery.")
        act(request, delivery)
        return redirect(reverse("admin:delivery_delivery_change", args=[quote(delivery.pk)]))


def page_actions(delivery: Delivery) -> list[PageAction]:
    """The buttons this delivery's status allows."""
    actions = []
    if delivery.status in RESENDABLE:
        actions.append(
            PageAction(
                "Resend",
                reverse("admin:delivery_delivery_resend", args=[quote(delivery.pk)]),
                "Send it again through the tenant's lane, with the same webhook-id.",
            )
        )
    if delivery.status == Delivery.Status.RETRY_SCHEDULED:
        actions.append(
            PageAction(
                "Retry now",
                reverse("admin:delivery_delivery_retry_now", args=[quote(delivery.pk)]),
                "Attempt it at the tenant's next turn instead of at its next attempt time.",
            )
        )
    return actions


def _record(request: HttpRequest, delivery: Delivery, action: str, **detail: object) -> None:
    audit.record(
        actor=request.user,
        action=action,
        via=AuditEntry.Via.ADMIN,
        tenant=delivery.tenant,
        target=f"delivery {delivery.pk}",
        event=delivery.event_id,
        **detail,
    )


def _resend(request: HttpRequest, delivery: Delivery) -> None:
    was = delivery.status
    if resend([delivery]) == 0:
        messages.warning(
            request,
            f"Delivery {delivery.pk} was not resent: it is {delivery.get_status_display().lower()}"
            " (only delivered or dead deliveries are resent).",
        )
        return
    _record(request, delivery, AuditEntry.Action.DELIVERY_RESENT, status_before=was)
    messages.success(
        request,
        f"Delivery {delivery.pk} resent: it is back in its tenant's lane (same webhook-id).",
    )


def _retry_now(request: HttpRequest, delivery: Delivery) -> None:
    result = retry_now(delivery)
    if result is RetryNow.QUEUED:
        _record(
            request,
            delivery,
            AuditEntry.Action.DELIVERY_RETRIED,
            was_due=delivery.next_attempt_at.isoformat() if delivery.next_attempt_at else None,
        )
        messages.success(request, result.message(delivery))
    else:
        messages.warning(request, result.message(delivery))
