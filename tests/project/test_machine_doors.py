"""The machine doors run on the lighter middleware stack; every other URL on the full one."""

import io
import json
from wsgiref.util import setup_testing_defaults

import pytest
from django.conf import settings

from project.machine_doors import MachineDoorsDispatcher
from tests import signing
from tests.factories import make_endpoint, make_source, make_tenant
from webhooks.models import Event

pytestmark = pytest.mark.django_db(transaction=True)


def call(app, method: str, path: str, body: bytes = b"", **headers: str):
    environ: dict = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "SERVER_NAME": "127.0.0.1",
        "HTTP_HOST": "127.0.0.1",
        "CONTENT_LENGTH": str(len(body)),
        "CONTENT_TYPE": "application/json",
        "wsgi.input": io.BytesIO(body),
        **headers,
    }
    setup_testing_defaults(environ)
    answer: dict = {}

    def start_response(status: str, response_headers: list, exc_info=None) -> None:
        answer["status"] = int(status.split()[0])
        answer["headers"] = dict(response_headers)

    answer["body"] = b"".join(app(environ, start_response))
    return answer


def test_the_machine_list_is_a_subset_of_the_full_one_in_the_same_order() -> None:
    full = settings.MIDDLEWARE
    assert [name for name in full if name in settings.MACHINE_MIDDLEWARE] == (
        settings.MACHINE_MIDDLEWARE
    )
    assert "django.contrib.sessions.middleware.SessionMiddleware" not in (
        settings.MACHINE_MIDDLEWARE
    )


def test_ingest_answers_through_the_light_stack_and_pages_through_the_full_one() -> None:
    app = MachineDoorsDispatcher()
    assert "django.contrib.sessions.middleware.SessionMiddleware" in settings.MIDDLEWARE
    source = make_source("gen", secret="k", fairness_key="body.shop", hmac_header="X-Signature")
    source.destinations.add(make_endpoint(None))
    make_tenant("s1")
    body = b'{"shop": "s1"}'
    accepted = call(app, "POST", "/ingest/gen/", body, HTTP_X_SIGNATURE=signing.hmac_hex("k", body))
    assert accepted["status"] == 202, accepted["body"]
    assert Event.objects.filter(pk=json.loads(accepted["body"])["id"]).exists()
    # XFrameOptionsMiddleware is on the full stack only; a refusal is still JSON.
    assert "X-Frame-Options" not in accepted["headers"]
    unknown = call(app, "POST", "/ingest/nope/")
    assert unknown["status"] == 404 and json.loads(unknown["body"])["error"]
    assert "X-Frame-Options" not in call(app, "POST", "/api/v1/events")["headers"]
    page = call(app, "GET", "/admin/login/")
    assert page["status"] == 200 and page["headers"]["X-Frame-Options"] == "DENY"


# The last: fullwidth digits, which str.isdigit() takes for digits.
@pytest.mark.parametrize("declared", ["abc", "2, 2", "-1", "\uff11\uff12"])
@pytest.mark.parametrize("path", ["/admin/login/", "/ingest/shop/", "/api/v1/tenants"])
def test_a_content_length_that_is_not_a_number_is_400_on_every_stack(declared, path) -> None:
    answer = call(MachineDoorsDispatcher(), "POST", path, b"ab", CONTENT_LENGTH=declared)
    assert answer["status"] == 400
    assert answer["body"] == b"Content-Length is not a number\n"
