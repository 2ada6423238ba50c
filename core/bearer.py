"""The token in an `Authorization: Bearer <token>` header (RFC 6750). The scheme is
case-insensitive (RFC 7235: "bearer" and "BEARER" are "Bearer"); a header without it, a
bare token, is no credential at all."""


def bearer_token(authorization: str) -> str | None:
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()
