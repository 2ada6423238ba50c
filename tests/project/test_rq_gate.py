"""django-rq's pages need django_rq.admin: staff without it can neither see nor empty a queue."""

import django_rq
import pytest
from django.contrib.auth.models import Permission, User
from django.urls import URLPattern, reverse
from django_rq import urls as rq_urls

from tests.factories import make_user

# Transactions commit: django-rq enqueues on commit (its COMMIT_MODE "on_db_commit").
pytestmark = pytest.mark.django_db(transaction=True)

# A value for every argument django-rq's URLs take.
ARGUMENTS = {
    "queue_index": 0,
    "connection_index": 0,
    "scheduler_index": 0,
    "job_id": "no-such-job",
    "result_id": "no-such-result",
    "key": "no-such-worker",
    "scheduler_name": "no-such-scheduler",
    "cron_job_name": "no-such-cron-job",
    "token": "notthetoken",
}
DEFAULT = 0  # RQ_QUEUES sorted by name: default, maintenance


def every_rq_url() -> list[str]:
    urls = []
    for pattern in rq_urls.urlpatterns:
        assert isinstance(pattern, URLPattern)
        names = set(pattern.pattern.regex.groupindex)
        if names == {"token"}:  # an optional regex group, which reverse() cannot fill
            urls.append(reverse(f"django_rq:{pattern.name}") + ARGUMENTS["token"] + "/")
            continue
        kwargs = {name: ARGUMENTS[name] for name in names}
        urls.append(reverse(f"django_rq:{pattern.name}", kwargs=kwargs or None))
    return urls


def in_admin(path: str) -> str:
    """The same page inside the admin (django-rq's admin entry)."""
    return path.replace("/admin/django-rq/", "/admin/django_rq/dashboard/")


@pytest.fixture
def queue():
    queue = django_rq.get_queue("default")
    for _ in range(3):
        queue.enqueue("os.getpid")
    assert queue.count == 3
    return queue


def queue_operator() -> User:
    user = make_user("queues", staff=True)
    user.user_permissions.add(
        Permission.objects.get(codename="admin", content_type__app_label="django_rq")
    )
    return User.objects.get(pk=user.pk)  # a fresh instance: no cached permissions


def test_staff_without_the_permission_get_403_on_every_rq_page(client) -> None:
    client.force_login(make_user("clerk", staff=True))
    for url in every_rq_url():
        assert client.get(url).status_code == 403, url
        assert client.get(in_admin(url)).status_code == 403, in_admin(url)
    assert client.get(reverse("admin:django_rq_dashboard_changelist")).status_code == 403


def test_staff_without_the_permission_cannot_empty_a_queue(client, queue) -> None:
    client.force_login(make_user("clerk", staff=True))
    empty = reverse("django_rq:clear", args=[DEFAULT])
    assert client.post(empty).status_code == 403
    assert client.post(in_admin(empty)).status_code == 403
    assert queue.count == 3


def test_anonymous_users_go_to_the_admin_login(client) -> None:
    response = client.get(reverse("django_rq:home"))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


@pytest.mark.parametrize("who", ["operator", "superuser"])
def test_permitted_users_see_and_empty_the_queues(client, queue, who) -> None:
    if who == "operator":
        client.force_login(queue_operator())
    else:
        client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    for url in (reverse("django_rq:home"), reverse("django_rq:jobs", args=[DEFAULT])):
        assert client.get(url).status_code == 200, url
        assert client.get(in_admin(url)).status_code == 200, in_admin(url)
    assert client.post(reverse("django_rq:clear", args=[DEFAULT])).status_code == 302
    assert queue.count == 0


def test_a_queue_or_job_that_does_not_exist_is_404_not_500(client) -> None:
    client.force_login(queue_operator())
    missing = [
        reverse("django_rq:jobs", args=[99]),
        reverse("django_rq:cron_scheduler_detail", args=[9, "no-such-scheduler"]),
        reverse("django_rq:delete_job", args=[DEFAULT, "no-such-job"]),
        reverse("django_rq:requeue_job", args=[DEFAULT, "no-such-job"]),
    ]
    for url in missing:
        assert client.get(url).status_code == 404, url
        assert client.get(in_admin(url)).status_code == 404, in_admin(url)


def test_no_rq_page_answers_500_to_a_permitted_user(client) -> None:
    """Whatever an operator types in the URL: unknown workers, schedulers (rq-scheduler is
    not installed), jobs and results are a 4xx, never a server error."""
    client.force_login(queue_operator())
    client.raise_request_exception = False
    for url in every_rq_url():
        for page in (url, in_admin(url)):
            status = client.get(page).status_code
            assert status < 500, (page, status)


def test_a_registered_workers_page_still_opens(client) -> None:
    from rq import Worker

    worker = Worker(["default"], connection=django_rq.get_connection("default"))
    worker.register_birth()
    try:
        client.force_login(queue_operator())
        page = reverse("django_rq:worker_details", args=[DEFAULT, worker.key])
        assert client.get(page).status_code == 200
        assert worker.name in client.get(page).content.decode()
    finally:
        worker.register_death()
