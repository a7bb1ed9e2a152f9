"""Read deadlines uvicorn does not have: a request's head must arrive in time, and a body nobody reads any
more (the answer went out before it had all arrived) is not waited for forever.

uvicorn's only read timeout is `timeout_keep_alive`, for an idle connection between requests, and every
byte received resets it: a client sending one byte every 2 s (slowloris) would hold a connection for as long
as it liked, and forty such would hold forty connections. ASGI middleware cannot
help with the head, which uvicorn parses before the app is called, so this is uvicorn's pure-Python
(h11) protocol with two timers. The body's own deadline, while the app reads it, is
`shared.server.bodies.BodyLimit` (it can still answer 408).
"""
from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)
_HEAD, _REST = "its request head", "the rest of a body already answered"


def h11_with_deadlines(header_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, dropping a connection whose request head has not arrived within
    `header_timeout_s` of the connection opening (or of the first byte of a later request on it), and one
    still sending a body `header_timeout_s` after its answer went out."""

    class H11WithDeadlines(H11Protocol):
        _timer: asyncio.TimerHandle | None = None
        _what = _HEAD

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn
            super().connection_made(transport)
            self._arm(_HEAD)

        def data_received(self, data: bytes) -> None:
            if self._timer is None and self.conn.their_state is h11.IDLE:  # a new request on a kept connection
                self._arm(_HEAD)
            super().data_received(data)
            state = self.conn.their_state
            # The head is in (the app reads the body, under BodyLimit's deadline), or the body answered is.
            if (self._what == _HEAD and state is not h11.IDLE) or (self._what == _REST and state is not h11.SEND_BODY):
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
                # Answered before the body was all in (401, 413, 408): uvicorn reads on until it ends, so
                # that the client gets to read the answer; not for longer than this.
                self._arm(_REST)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self, what: str) -> None:
            self._disarm()
            self._what = what
            self._timer = self.loop.call_later(header_timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _expired(self) -> None:
            self._timer = None
            if not self.transport.is_closing():
                log.info("closing the connection from %s: %s did not arrive within %g s",
                         self.client, self._what, header_timeout_s)
                self.transport.close()

    return H11WithDeadlines
