"""Request body accounting in the HTTP server: a chunked body over the limit is refused at once.

A ``Content-Length`` body over ``limits.max_body_bytes`` is refused by the app as soon as the
head arrives (:func:`gateway.asgi_io.read_body`). A chunked body (RFC 9112 §7.1) announces its
size one chunk at a time, in the chunk-size line; h11 alone would then wait for the announced
bytes (up to 20 hex digits: 2**80 bytes) and the app would only see the excess when it arrives,
or wait for ``limits.client_body_timeout_s`` when it never does.

:class:`BudgetedChunkedReader` replaces h11's chunked reader for request bodies and refuses the
body (h11 ``LocalProtocolError`` with ``error_status_hint`` :data:`TOO_LARGE_STATUS`, answered by
:mod:`gateway.http_guard` as ``413 request_too_large``) as soon as a chunk-size line, complete or
not, announces more than what is left of the limit, or has more hex digits than h11 reads.
"""

from __future__ import annotations

import re

import h11
from h11._readers import ChunkedReader
from h11._receivebuffer import ReceiveBuffer

__all__ = ["MAX_CHUNK_SIZE_DIGITS", "TOO_LARGE_STATUS", "BudgetedChunkedReader"]

TOO_LARGE_STATUS = 413
"""The status hint of the error raised for a body over its limit (RFC 9110 §15.5.14)."""

MAX_CHUNK_SIZE_DIGITS = 20
"""The longest chunk-size h11 parses, in hex digits; a longer one is refused as too large."""

# A chunk-size line starts after the CRLF that ends the previous chunk's data.
_SIZE_LINE = re.compile(rb"(?:\r?\n|\r)?([0-9A-Fa-f]*)")
_PEEK_BYTES = MAX_CHUNK_SIZE_DIGITS + 3


class BudgetedChunkedReader(ChunkedReader):
    """h11's chunked-body reader, refusing a body that would exceed ``limit`` bytes.

    Each call first looks at the chunk-size line at the head of the buffer (before h11 needs
    its CRLF), then lets h11 parse and read; the bytes announced by the current chunk plus the
    bytes already read must stay within ``limit``.

    Args:
        limit: The largest request body accepted, in bytes (``limits.max_body_bytes``).

    Raises:
        h11.LocalProtocolError: From a call, with ``error_status_hint`` 413, when the body is
            known to exceed ``limit`` (h11 re-raises it from ``next_event`` as a
            ``RemoteProtocolError``); h11's own errors for malformed chunks pass through.
    """

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.left = limit
        """Bytes the body may still bring (``limit`` minus the data bytes read so far)."""

    def __call__(self, buf: ReceiveBuffer) -> h11.Data | h11.EndOfMessage | None:
        """The next body event, as h11's reader returns it (``None``: more bytes needed)."""
        if self._bytes_in_chunk == 0 and not self._reading_trailer:
            self._check_size_line(buf)
        event = super().__call__(buf)
        if type(event) is h11.Data:
            self.left -= len(event.data)
        if self._bytes_in_chunk > self.left:
            self._refuse()
        return event

    def _check_size_line(self, buf: ReceiveBuffer) -> None:
        # h11's private buffer, read without copying more than a size line can hold (h11 is
        # pinned; tests/gateway/test_chunked_body_limit.py fails if this stops working).
        head = bytes(buf._data[:_PEEK_BYTES])
        match = _SIZE_LINE.match(head)
        digits = match.group(1) if match is not None else b""
        if len(digits) > MAX_CHUNK_SIZE_DIGITS or (digits and int(digits, 16) > self.left):
            self._refuse()

    def _refuse(self) -> None:
        raise h11.LocalProtocolError(
            f"chunked request body over the limit of {self.limit} bytes",
            error_status_hint=TOO_LARGE_STATUS,
        )
