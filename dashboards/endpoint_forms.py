"""The forms a tenant admin fills in on the portal. Only what a tenant may decide is here:
where events go and which ones. Caps, rates and weights are the operators' (admin only)."""

from django import forms

from core import operational
from tenants.admin import EndpointForm

MAX_EVENT_TYPES = 50
MAX_EVENT_TYPE_CHARS = 200
MIN_OVERLAP_HOURS, DEFAULT_OVERLAP_HOURS, MAX_OVERLAP_HOURS = 1, 24, 168
DISABLE_REASON_CHARS = 400


class PortalEndpointForm(EndpointForm):
    """The admin's endpoint form cut down to the tenant's own fields. Subclassed, not
    copied, so the URL passes the very same SSRF check (core.netguard) as in the admin."""

    class Meta(EndpointForm.Meta):
        fields = ["url", "description", "event_types", "operational_events", "send_trace_context"]
        widgets = {"event_types": forms.Textarea(attrs={"rows": 3})}

    def clean_event_types(self) -> str:
        raw = self.cleaned_data.get("event_types", "")
        types = [item.strip() for item in raw.replace("\n", ",").split(",") if item.strip()]
        if len(types) > MAX_EVENT_TYPES:
            raise forms.ValidationError(f"At most {MAX_EVENT_TYPES} event types.")
        for item in types:
            if len(item) > MAX_EVENT_TYPE_CHARS or not item.isprintable():
                raise forms.ValidationError(
                    f"Each event type is printable text of at most {MAX_EVENT_TYPE_CHARS} "
                    "characters."
                )
        # Stored one way, so the audit trail's old/new values compare like for like.
        return ", ".join(dict.fromkeys(types))

    def clean_operational_events(self) -> str:
        raw = self.cleaned_data.get("operational_events", "")
        types = [item.strip() for item in raw.replace("\n", ",").split(",") if item.strip()]
        unknown = [item for item in types if item != "*" and item not in operational.TYPES]
        if unknown:
            raise forms.ValidationError(
                f"Not an operational event: {', '.join(unknown)}. "
                f"They are: {', '.join(operational.TYPES)} (or * for all)."
            )
        return ",".join(dict.fromkeys(types))


class DisableForm(forms.Form):
    reason = forms.CharField(
        max_length=DISABLE_REASON_CHARS,
        help_text="Shown on this page and in the audit trail.",
    )


class RotateForm(forms.Form):
    overlap_hours = forms.IntegerField(
        min_value=MIN_OVERLAP_HOURS,
        max_value=MAX_OVERLAP_HOURS,
        initial=DEFAULT_OVERLAP_HOURS,
        help_text="How long the old secret keeps signing beside the new one.",
    )
