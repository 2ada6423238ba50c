"""What second factors an operator has: one TOTP authenticator (confirmed once a code
from it was typed back) and one set of recovery codes, each usable once."""

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

RECOVERY_CODE_COUNT = 10
AUTHENTICATOR_NAME = "authenticator"
RECOVERY_NAME = "recovery codes"


def authenticator(user: AbstractBaseUser) -> TOTPDevice | None:
    """The user's confirmed authenticator, if enrolment was finished."""
    return TOTPDevice.objects.filter(user=user, confirmed=True).order_by("pk").first()


def pending_authenticator(user: AbstractBaseUser) -> TOTPDevice:
    """The authenticator being enrolled: the same secret on every visit to the page until a
    code confirms it (a reload must not invalidate the QR code already scanned)."""
    device = TOTPDevice.objects.filter(user=user, confirmed=False).order_by("pk").first()
    if device is None:
        device = TOTPDevice.objects.create(user=user, name=AUTHENTICATOR_NAME, confirmed=False)
    return device


def recovery_device(user: AbstractBaseUser) -> StaticDevice | None:
    return StaticDevice.objects.filter(user=user, confirmed=True).order_by("pk").first()


def recovery_codes_left(user: AbstractBaseUser) -> int:
    return StaticToken.objects.filter(device__user=user, device__confirmed=True).count()


@transaction.atomic
def new_recovery_codes(user: AbstractBaseUser) -> list[str]:
    """A fresh set of codes; the old ones stop working. Returned once, to be shown once."""
    device, _ = StaticDevice.objects.get_or_create(
        user=user, name=RECOVERY_NAME, defaults={"confirmed": True}
    )
    device.token_set.all().delete()
    codes = [StaticToken.random_token() for _ in range(RECOVERY_CODE_COUNT)]
    StaticToken.objects.bulk_create(StaticToken(device=device, token=code) for code in codes)
    return codes


@transaction.atomic
def forget(user: AbstractBaseUser) -> int:
    """Remove every second factor of the user (a lost phone): the next sign-in enrols
    again. Returns how many devices went."""
    removed = 0
    for model in (TOTPDevice, StaticDevice):
        _, by_model = model.objects.filter(user=user).delete()
        removed += by_model.get(model._meta.label, 0)
    return removed
