"""The admin as an operator sees it in real headless Chromium: the index's overview link
and the changelists at a laptop's width."""

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def admin_page(chromium, live_server, browser_settings) -> Iterator[object]:
    """A page signed in as a superuser, at a 1400 x 900 viewport."""
    user = User.objects.create_superuser("ops", "ops@example.com", "pw-ops")
    client = Client()
    client.force_login(user)
    context = chromium.new_context(viewport={"width": 1400, "height": 900})
    context.add_cookies(
        [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]
    )
    page = context.new_page()
    yield page
    context.close()


def test_the_operations_overview_link_reads_as_one_line(admin_page, live_server, artifacts) -> None:
    admin_page.goto(live_server.url + reverse("admin:index"))
    admin_page.screenshot(path=str(artifacts / "admin-index.png"))
    link = admin_page.locator("#operations-overview-link a", has_text="Operations overview")
    box = link.bounding_box()
    line_height = admin_page.evaluate(
        "(el) => parseFloat(getComputedStyle(el).lineHeight) || el.getBoundingClientRect().height",
        link.element_handle(),
    )
    # One letter per line made it about 19 lines tall and one letter wide.
    assert box["height"] <= line_height * 1.5, box
    assert box["width"] > 100, box
