"""docs/API.md's onboarding, run as written: its shell blocks, in order, with curl, against
a live server, a delivery worker and a receiver on 127.0.0.1, from an empty database and
one operator token. The page cannot drift from the API without this failing."""

import re
import subprocess
from pathlib import Path

import pytest

from api.models import PortalLink
from delivery.models import Delivery, ReplayJob
from tenants.models import AuditEntry, Membership, Tenant
from tests.api.helpers import operator_token
from tests.delivery_helpers import start_worker
from tests.http_receivers import Recorder

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
DOC = Path(__file__).resolve().parents[2] / "docs" / "API.md"
SECTION = "## Onboarding, step by step"


def walkthrough() -> str:
    """The shell blocks of the onboarding section, joined in their order."""
    text = DOC.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", len(SECTION))]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) >= 8, "the onboarding lost its steps"
    return "\n".join(blocks)


@pytest.fixture
def worker():
    process = start_worker(MAINTENANCE_INTERVAL_SECONDS="1", REPLAY_FEED_SECONDS="0.2")
    yield process
    process.terminate()
    process.wait(15)


def test_the_onboarding_in_docs_api_runs_as_written(live_server, settings, worker) -> None:
    settings.ALLOW_PRIVATE_DESTINATIONS = True
    token = operator_token()
    with Recorder() as receiver:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", walkthrough()],
            env={
                "PATH": "/usr/bin:/bin:/usr/local/bin",
                "BASE": live_server.url,
                "TOKEN": token,
                "RECEIVER": receiver.url + "acme",
            },
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        lines = done.stdout.splitlines()
        assert "303" in lines  # the portal link signed its visitor in
        assert "delivered" in lines  # the worker delivered the event in its turn
        # The event, then its resend: the receiver saw the same webhook-id twice.
        arrived = receiver.wait_for(2, timeout=30)
        assert arrived[0].headers["webhook-id"] == arrived[1].headers["webhook-id"]
    tenant = Tenant.objects.get(key="acme")
    assert tenant.endpoints.count() == 1
    assert PortalLink.objects.get().used_at is not None
    assert Membership.objects.get(tenant=tenant).role == Membership.ADMIN
    assert ReplayJob.objects.filter(tenant=tenant).count() == 1
    assert Delivery.objects.filter(tenant=tenant).count() == 1
    via_api = set(AuditEntry.objects.filter(via="api").values_list("action", flat=True))
    assert {
        AuditEntry.Action.TENANT_CREATED,
        AuditEntry.Action.ENDPOINT_CREATED,
        AuditEntry.Action.PORTAL_LINK_CREATED,
        AuditEntry.Action.DELIVERY_RESENT,
        AuditEntry.Action.REPLAY_STARTED,
    } <= via_api
