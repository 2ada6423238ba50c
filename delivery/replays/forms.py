"""The form that names a replay window, shared by the admin and the tenant portal.

Bound to a tenant (the portal), it offers that tenant's endpoints only, so another
tenant's endpoint id is an invalid choice, not a lookup. Unbound (the admin), it asks
for the tenant's key and checks the endpoint id belongs to it.
"""

from datetime import timedelta

from django import forms
from django.utils import timezone

from delivery.models import Delivery
from delivery.replays.window import STATUSES, Window
from tenants.models import Endpoint, Tenant

ENDPOINTS_OFFERED = 500  # a tenant has a handful; a select of more helps nobody
STATUS_CHOICES = [(status, Delivery.Status(status).label) for status in STATUSES]
# datetime-local with seconds: the browser shows a picker, and the value parses as ISO.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"


def last_hour() -> dict:
    """Initial values for an empty form: the last hour, to the second."""
    now = timezone.now().replace(microsecond=0)
    return {"start": now - timedelta(hours=1), "end": now}


def _time_input() -> forms.DateTimeInput:
    return forms.DateTimeInput(attrs={"type": "datetime-local", "step": "1"}, format=TIME_FORMAT)


class WindowForm(forms.Form):
    tenant = forms.CharField(label="Tenant key", max_length=255)
    endpoint = forms.IntegerField(
        label="Endpoint id", required=False, help_text="Empty: all endpoints.", min_value=1
    )
    statuses = forms.MultipleChoiceField(
        choices=STATUS_CHOICES,
        # Dead letters only, unless asked: replaying is mostly for what never arrived, and
        # a window's delivered deliveries would go out a second time to every endpoint.
        initial=[str(Delivery.Status.DEAD)],
        widget=forms.CheckboxSelectMultiple,
        help_text="Tick Delivered to send deliveries that already arrived once more. Pending, "
        "retrying and held deliveries are never replayed: they are still on their way or wait "
        "for their endpoint.",
    )
    event_type = forms.CharField(
        label="Event type", max_length=200, required=False, help_text="Empty: every type."
    )
    start = forms.DateTimeField(label="From", widget=_time_input())
    end = forms.DateTimeField(
        label="To",
        widget=_time_input(),
        help_text="Deliveries made from, up to but not at, this time.",
    )

    def __init__(self, *args, tenant: Tenant | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.bound_tenant = tenant
        if tenant is not None:
            del self.fields["tenant"]
            endpoints = Endpoint.objects.filter(tenant=tenant).order_by("url")[:ENDPOINTS_OFFERED]
            self.fields["endpoint"] = forms.TypedChoiceField(
                label="Endpoint",
                required=False,
                coerce=int,
                empty_value=None,
                choices=[("", "All endpoints")] + [(e.pk, e.url) for e in endpoints],
            )

    def clean_tenant(self) -> Tenant:
        tenant = Tenant.objects.filter(key=self.cleaned_data["tenant"].strip()).first()
        if tenant is None:
            raise forms.ValidationError("No tenant has this key.")
        return tenant

    def clean(self) -> dict:
        data = super().clean()
        start, end = data.get("start"), data.get("end")
        if start and end and end <= start:
            self.add_error("end", "“To” must be after “From”.")
        tenant = self.chosen_tenant()
        endpoint = data.get("endpoint")
        # Bound to a tenant, the choices already hold only its endpoints.
        foreign = (
            tenant is not None
            and endpoint is not None
            and self.bound_tenant is None
            and not Endpoint.objects.filter(pk=endpoint, tenant=tenant).exists()
        )
        if foreign:
            self.add_error("endpoint", "This tenant has no endpoint with this id.")
        return data

    def chosen_tenant(self) -> Tenant | None:
        return self.bound_tenant or self.cleaned_data.get("tenant")

    def window(self) -> Window:
        """The window asked for; only once is_valid()."""
        data = self.cleaned_data
        return Window(
            start=data["start"],
            end=data["end"],
            statuses=tuple(data["statuses"]),
            endpoint_id=data.get("endpoint"),
            event_type=data.get("event_type", "").strip(),
        )
