"""A request whose Content-Length is not a number is a 400, before anything reads it.

Django reads the header with int() wherever it needs the body's size, and so does
django_prometheus's middleware on every request, so "abc" or "2, 2" (two values folded
into one) raised a ValueError there: a 500 under servers that pass the header through.
gunicorn refuses such requests itself; this holds for every server."""

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest


class MalformedContentLengthMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        declared = request.META.get("CONTENT_LENGTH")
        # RFC 9110: one or more digits. Empty is how some servers say there is none.
        if declared and not (declared.isascii() and declared.isdigit()):
            return HttpResponseBadRequest(
                "Content-Length is not a number\n", content_type="text/plain; charset=utf-8"
            )
        return self.get_response(request)
