"""Calling the management API as its clients do: JSON, a bearer token."""

import json

from django.test import Client

from tenants.models import Tenant
from webhooks.models import ApiToken


def operator_token(access: str = ApiToken.Access.WRITE) -> str:
    return ApiToken.issue("operator", access=access)[1]


def tenant_token(tenant: Tenant, access: str = ApiToken.Access.WRITE) -> str:
    return ApiToken.issue(f"{tenant.key} token", tenant=tenant, access=access)[1]


class Api:
    """A test client that sends `token` and JSON bodies."""

    def __init__(self, token: str | None, client: Client | None = None) -> None:
        self.client = client or Client()
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def call(self, method: str, path: str, body: object = None, **headers: str):
        data = json.dumps(body) if body is not None else None
        return self.client.generic(
            method.upper(),
            path,
            data=data or "",
            content_type="application/json",
            headers={**self.headers, **headers},
        )

    def get(self, path: str, **headers: str):
        return self.call("GET", path, **headers)

    def post(self, path: str, body: object = None, **headers: str):
        return self.call("POST", path, body if body is not None else {}, **headers)

    def patch(self, path: str, body: object, **headers: str):
        return self.call("PATCH", path, body, **headers)

    def delete(self, path: str, **headers: str):
        return self.call("DELETE", path, **headers)
