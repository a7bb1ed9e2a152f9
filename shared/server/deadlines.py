"""Read deadlines uvicorn does not have: a request's head must arrive in time and be no larger than a cap, and
a body nobody reads any more (the answer went out before it had all arrived) is not waited for forever.

uvicorn's only read timeout is `timeout_keep_alive`, for an idle connection between requests, and every
byte received resets it: a client sending one byte every 2 s (slowloris) would hold a connection for as long
as it liked, and forty such would hold forty connections. ASGI middleware cannot
help with the head, which uvicorn parses before the app is called, so these are uvicorn's own protocols with
two timers: `httptools_with_deadlines` (the C parser, what the services serve with) and `h11_with_deadlines`
(the pure-Python one). The body's own deadline, while the app reads it, is
`shared.server.bodies.BodyLimit` (it can still answer 408).
"""
from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)
_HEAD, _REST = "its request head", "the rest of a body already answered"
# h11's own cap on a request head (h11.DEFAULT_MAX_INCOMPLETE_EVENT_SIZE): httptools (llhttp) has none, and
# would buffer a header line of any length.
MAX_HEAD_BYTES = 16 * 1024
# How much of a body the httptools protocol holds for the app before it stops reading. uvicorn pauses at 64 KiB,
# under one of uvloop's 256 KiB reads: every read then paused the socket and waited a loop turn for the app,
# which doubled the server's CPU for reading a 60 MB body (docs/decisions/httptools-and-uvloop.md). It adds no
# memory a caller could not take anyway: the routes read a body whole (up to their limit) before using it.
BODY_HIGH_WATER_BYTES = 2**20


class _Deadline:
    """The timer both protocols share: armed for the head or for the rest of an answered body, it closes the
    connection when it expires. Mixed into a uvicorn protocol (its `loop`, `transport`, `client`)."""

    header_timeout_s: float
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    client: tuple[str, int] | None
    _timer: asyncio.TimerHandle | None = None
    _what = _HEAD

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]  # the protocol's, after this in the MRO
        self._arm(_HEAD)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm(self, what: str) -> None:
        self._disarm()
        self._what = what
        self._timer = self.loop.call_later(self.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if not self.transport.is_closing():
            log.info("closing the connection from %s: %s did not arrive within %g s",
                     self.client, self._what, self.header_timeout_s)
            self.transport.close()


def h11_with_deadlines(header_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, dropping a connection whose request head has not arrived within
    `header_timeout_s` of the connection opening (or of the first byte of a later request on it), and one
    still sending a body `header_timeout_s` after its answer went out. (h11 caps the head at 16 KiB itself.)"""

    class H11WithDeadlines(_Deadline, H11Protocol):
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

    H11WithDeadlines.header_timeout_s = header_timeout_s
    return H11WithDeadlines


class _HeadTooLarge(Exception):
    """Raised from the parser's callback: httptools turns it into an HttpParserError, which uvicorn answers 400."""


def httptools_with_deadlines(header_timeout_s: float) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the same deadlines as `h11_with_deadlines`, and h11's cap on a request
    head (`MAX_HEAD_BYTES`): a larger one is answered 400 and its connection closed, as h11 does."""

    class HttpToolsWithDeadlines(_Deadline, HttpToolsProtocol):
        # Where the peer's current request is: between requests, in its head, or in its body.
        _state = "idle"
        _head_bytes = 0  # bytes read since the request began (its head, while the head is not complete)
        _head_size = 0  # the parsed head so far: target and header lines

        def data_received(self, data: bytes) -> None:
            if self._state == "body":
                super().data_received(data)
                return
            if self._timer is None:  # a new request on a kept connection
                self._arm(_HEAD)
            self._head_bytes += len(data)
            super().data_received(data)
            # Every byte fed since the request began is its head while the head is not complete.
            if self._state != "body" and self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                log.info("closing the connection from %s: a request head over %d bytes", self.client, MAX_HEAD_BYTES)
                self.send_400_response("Invalid HTTP request received.")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._state, self._head_size = "head", 0

        def on_url(self, url: bytes) -> None:
            super().on_url(url)
            self._head_size += len(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            super().on_header(name, value)
            self._head_size += len(name) + len(value) + 4  # ": " and CRLF
            if self._head_size > MAX_HEAD_BYTES:  # a whole head in one read: _head_bytes counts its body too
                raise _HeadTooLarge

        def on_headers_complete(self) -> None:
            self._state = "body"
            if self._what == _HEAD:  # the app reads the body, under BodyLimit's deadline
                self._disarm()
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:  # uvicorn's, with BODY_HIGH_WATER_BYTES for its 64 KiB
            if (self.parser.should_upgrade() and self._should_upgrade()) or self.cycle.response_complete:
                return
            self.cycle.body += body
            if len(self.cycle.body) > BODY_HIGH_WATER_BYTES:
                self.flow.pause_reading()
            self.cycle.message_event.set()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._state, self._head_bytes = "idle", 0
            if self._what == _REST:
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._state == "body" and not self.transport.is_closing():
                # Answered before the body was all in (401, 413, 408): see h11_with_deadlines.
                self._arm(_REST)

    HttpToolsWithDeadlines.header_timeout_s = header_timeout_s
    return HttpToolsWithDeadlines

