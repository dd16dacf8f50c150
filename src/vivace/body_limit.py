"""A cap on HTTP request bodies, for the two servers vivace runs: the environment server
(sandbox/server.py) and `vivace serve` (inference/server.py).

Starlette reads a request's whole body into memory, and the servers then parse it: without a cap
one large request can take gigabytes (a 47 MB chat request grew `vivace serve` from 0.5 to 4.4 GB
and held a core for 34 s before its prompt was found too long for the context).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.responses import Response


class BodyTooLarge(HTTPException):
    """Raised by `BodyLimit` from the app's next read of a body past its limit. An HTTPException
    because FastAPI re-raises those from body parsing (any other error becomes a 400): each app's
    HTTPException handler answers it, in its own error shape, with 413."""

    def __init__(self, message: str) -> None:
        super().__init__(413, message)


class BodyLimit:
    """Pure ASGI middleware: a request body over its limit is refused with 413 without being read
    whole: by its Content-Length before the app runs (`too_large(message)` is the response), and,
    for a chunked body, by the app's first read past the limit (which raises `BodyTooLarge`).

    `max_upload_bytes`, when given, is the limit of PUT bodies (file uploads); `what` names the
    server in the message."""

    def __init__(
        self,
        app: Any,
        max_bytes: int,
        too_large: Callable[[str], Response],
        what: str,
        max_upload_bytes: int | None = None,
    ) -> None:
        self.app, self.max_bytes, self.too_large, self.what = app, max_bytes, too_large, what
        self.max_upload_bytes = max_upload_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        upload = self.max_upload_bytes is not None and scope["method"] == "PUT"
        limit = self.max_upload_bytes if upload else self.max_bytes
        assert limit is not None
        message = f"{'upload' if upload else 'request body'} over {limit} bytes ({self.what}'s limit)"
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await self.too_large(message)(scope, receive, send)
            return
        received = 0

        async def receive_within_limit() -> dict:
            nonlocal received
            event = await receive()
            if event["type"] == "http.request":
                received += len(event.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(message)
            return event

        await self.app(scope, receive_within_limit, send)
