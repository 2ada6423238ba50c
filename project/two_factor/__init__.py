"""Operators' second factor (django-otp): a TOTP authenticator and one-use recovery codes,
required of staff when ADMIN_REQUIRE_2FA is on. gate.py holds the door, pages.py the
enrolment and the check, devices.py what a user has."""
