"""Times in the viewer's own time zone, to the second.

The portal's pages set a `tz` cookie to the browser's IANA zone (dashboards/static/
tenants/timezone.js); this middleware activates it, so Django renders every time on the
page in that zone and reads the times typed into forms (the message log's and replays'
from/to) in the same zone. Without the cookie (the very first page, a script-less
client) times stay in settings.TIME_ZONE, and each page names the zone it shows.
"""

import re
from collections.abc import Callable
from urllib.parse import unquote
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.http import HttpRequest, HttpResponse
from django.utils import timezone

COOKIE = "tz"
# IANA names: "Europe/Berlin", "America/Argentina/Buenos_Aires", "Etc/GMT+5". No dots,
# so a cookie can never name a path outside the zone database.
ZONE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_+\-]*(/[A-Za-z0-9_+\-]+){0,2}")


def viewer_zone(request: HttpRequest) -> ZoneInfo | None:
    """The zone the viewer's browser reported, if it names a real one."""
    name = unquote(request.COOKIES.get(COOKIE, ""))  # "Europe%2FBerlin" from some clients
    if not name or len(name) > 64 or not ZONE_NAME.fullmatch(name):
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


class ViewerTimeZoneMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        zone = viewer_zone(request)
        if zone is None:
            timezone.deactivate()
        else:
            timezone.activate(zone)
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()  # a worker thread's next request starts clean
