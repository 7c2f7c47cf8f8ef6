"""What stands before the routes of a public server: the API key and the body-size cap (ASGI middleware).

:class:`RequireKey` answers 401 in OpenAI's error shape to a request without
``Authorization: Bearer <key>`` naming the server's key; keys are compared as
SHA-256 digests with :func:`secrets.compare_digest`, so the time taken says
nothing about how much of a guess was right.  Every route is guarded except
``GET /health``, which stays open for liveness probes, as vLLM leaves it open
(its key guards only the ``/v1`` routes): without the key it answers only
``{"status": ...}``, its counters and cache statistics are for key holders.

:class:`BodyLimit` answers 413 to a body over the cap before any of it is
parsed: at once from ``Content-Length``, and for a chunked body as soon as
what has arrived passes the cap (nothing past it is read).
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from grammarspec.serve.protocol import error_body

__all__ = ["ApiKey", "RequireKey", "BodyLimit", "OPEN_PATHS", "DEFAULT_MAX_BODY_MB", "middleware"]

#: Routes answered without the key (only what a liveness probe needs).
OPEN_PATHS = ("/health",)
#: The default cap of a request body, in MiB (``--max-body-mb``).
DEFAULT_MAX_BODY_MB = 4.0


class ApiKey:
    """The server's key, kept as its digest; :meth:`allows` reads a request's ``Authorization`` header."""

    def __init__(self, key: str) -> None:
        if not key:
            raise ValueError("the API key is empty: give a non-empty key, or none to leave the server open")
        self._digest = hashlib.sha256(key.encode()).digest()

    def allows(self, headers: Headers) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        given = hashlib.sha256(token.strip().encode()).digest()
        return secrets.compare_digest(given, self._digest) and scheme.lower() == "bearer"


def _unauthorized(headers: Headers) -> JSONResponse:
    if not headers.get("authorization"):
        message = (
            "no API key was given: this server needs one, sent as the header 'Authorization: Bearer <key>' "
            "(the openai client's api_key)"
        )
    else:
        message = (
            "incorrect API key: send the key this server was started with (its --api-key or GRAMMARSPEC_API_KEY) "
            "as the header 'Authorization: Bearer <key>'"
        )
    return JSONResponse(
        error_body(message, code="invalid_api_key"), status_code=401, headers={"WWW-Authenticate": "Bearer"}
    )


class RequireKey:
    """ASGI middleware: every HTTP request but :data:`OPEN_PATHS` needs the key (401 otherwise)."""

    def __init__(self, app: ASGIApp, key: ApiKey) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            headers = Headers(scope=scope)
            if not self.key.allows(headers):
                await _unauthorized(headers)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _TooLarge(Exception):
    pass


def _too_large(limit: int) -> JSONResponse:
    message = (
        f"the request body is more than this server reads ({limit / 2**20:g} MiB: its --max-body-mb); "
        "send a shorter request (fewer or shorter messages, a smaller schema)"
    )
    return JSONResponse(error_body(message, code="request_too_large"), status_code=413)


class BodyLimit:
    """ASGI middleware: a body over ``limit`` bytes is a 413, answered before the body is parsed."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the body-size cap must be at least 1 byte, got {limit}")
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None:
            if not declared.isdigit():
                response = JSONResponse(error_body(f"Content-Length {declared!r} is not a number"), status_code=400)
                await response(scope, receive, send)
                return
            if int(declared) > self.limit:
                await _too_large(self.limit)(scope, receive, send)
                return
        received = 0
        started = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise _TooLarge
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, sending)
        except _TooLarge:
            if started:
                raise
            await _too_large(self.limit)(scope, receive, send)


def middleware(*, api_key: str | None, max_body_bytes: int) -> list[Any]:
    """Starlette ``Middleware`` entries, outermost first: the key (if any), then the body cap."""
    from starlette.middleware import Middleware

    entries = [Middleware(RequireKey, key=ApiKey(api_key))] if api_key is not None else []
    return entries + [Middleware(BodyLimit, limit=max_body_bytes)]
