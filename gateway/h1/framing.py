"""HTTP/1.1 response framing, without I/O: the status line and headers, and the body's length.

Strict where a relay must be (RFC 9112): a malformed status line (a status outside 100-599,
a control character in the reason phrase) or header line, a header section over
:data:`MAX_HEAD_BYTES`, an invalid or conflicting ``Content-Length``, a ``Transfer-Encoding``
other than ``chunked``, or malformed chunked framing (size line, missing CRLF after chunk data,
oversized trailers) raises :class:`ProtocolError`; the connection is then closed, never
reused. Obsolete line folding is refused, not unfolded.

Body length (RFC 9112 section 6.3): no body for 1xx/204/304; ``Transfer-Encoding: chunked``
(which wins over a ``Content-Length``; such a connection, and one of an HTTP/1.0 response
with a transfer coding, is not reused); ``Content-Length``;
otherwise everything up to the close of the connection.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "MAX_HEAD_BYTES",
    "PLAIN_SIZE_LINE",
    "ChunkedDecoder",
    "Head",
    "LengthDecoder",
    "ProtocolError",
    "parse_head",
]

MAX_HEAD_BYTES = 64 * 1024
"""Longest status line plus header section accepted (bytes, final CRLF CRLF included)."""

_MAX_CHUNK_LINE = 1024  # chunk size plus extensions
_MAX_TRAILERS = 16 * 1024
# RFC 9110 15: status codes are 100..599; RFC 9112 4: reason-phrase is HTAB, SP, VCHAR, obs-text.
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-5][0-9]{2})(?: ([\t\x20-\x7e\x80-\xff]*))?")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")
PLAIN_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,15})\r\n")
"""A chunk size line without extension (the usual one): the size in hex, then CRLF."""
_DIGITS = re.compile(rb"[0-9]{1,18}")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


class ProtocolError(Exception):
    """The upstream response is not valid HTTP/1.1 framing (the connection is closed)."""


@dataclass(slots=True)
class Head:
    """A parsed response head.

    Attributes:
        status: The status code (100-999).
        version: ``"1.0"`` or ``"1.1"``.
        headers: Lower-case name -> value (repeated fields joined with ``", "``, RFC 9110 5.3).
        content_length: The declared body length in bytes, ``None`` when not declared (or
            overridden by ``Transfer-Encoding``).
        chunked: The body uses the chunked transfer coding.
        keep_alive: The connection may carry another request after this response's body.
    """

    status: int
    version: str
    headers: dict[str, str]
    content_length: int | None
    chunked: bool
    keep_alive: bool

    @property
    def bodyless(self) -> bool:
        """The response has no body at all (1xx, 204, 304)."""
        return self.status < 200 or self.status in (204, 304)


def parse_head(raw: bytes) -> Head:
    """Parse a status line and header section (``raw`` ends with the empty line's CRLF).

    Raises:
        ProtocolError: Malformed status line or field line, obs-fold, an invalid or
            conflicting ``Content-Length``, or a transfer coding other than ``chunked``.
    """
    lines = raw.split(b"\r\n")
    match = _STATUS_LINE.fullmatch(lines[0])
    if match is None:
        raise ProtocolError(f"malformed status line {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:-2]:
        name, sep, value = line.partition(b":")
        if not sep or _TOKEN.fullmatch(name) is None:
            raise ProtocolError(f"malformed header line {line[:80]!r}")
        value = value.strip(b" \t")
        if _BAD_VALUE.search(value) is not None:
            raise ProtocolError(f"control character in header {name[:40]!r}")
        key = name.decode("ascii").lower()
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    if lines[-2:] != [b"", b""]:
        raise ProtocolError("header section not terminated by an empty line")
    version = "1." + match.group(1).decode()
    status = int(match.group(2))
    connection = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    keep_alive = "close" not in connection if version == "1.1" else "keep-alive" in connection
    chunked = False
    length: int | None = None
    coding = headers.get("transfer-encoding")
    if coding is not None:
        codings = [t.strip().lower() for t in coding.split(",")]
        if codings != ["chunked"]:
            raise ProtocolError(f"unsupported transfer coding {coding[:80]!r}")
        chunked = True
        if "content-length" in headers or version == "1.0":
            keep_alive = False  # RFC 9112 6.3, 6.1: chunked wins, then the connection is closed
    elif "content-length" in headers:
        values = {v.strip() for v in headers["content-length"].split(",")}
        if len(values) != 1:
            raise ProtocolError("conflicting Content-Length values")
        only = values.pop().encode()
        if _DIGITS.fullmatch(only) is None:
            raise ProtocolError(f"invalid Content-Length {only[:40]!r}")
        length = int(only)
    head = Head(status, version, headers, length, chunked, keep_alive)
    if head.bodyless:
        head.chunked, head.content_length = False, 0
    elif not chunked and length is None:
        head.keep_alive = False  # delimited by the close of the connection
    return head


class LengthDecoder:
    """A body of known length (``Content-Length``) or one delimited by the close.

    Args:
        length: Bytes expected, ``None`` for read-until-close.
    """

    __slots__ = ("done", "extra", "remaining")

    def __init__(self, length: int | None) -> None:
        self.remaining = length
        self.done = length == 0
        self.extra = b""  # bytes after the end of the body (never valid: we do not pipeline)

    def feed(self, data: bytes, out: list[bytes]) -> None:
        """Append the body bytes of ``data`` to ``out``; set :attr:`done` at the end."""
        remaining = self.remaining
        if remaining is None:
            out.append(data)
            return
        if len(data) < remaining:
            self.remaining = remaining - len(data)
            out.append(data)
            return
        if remaining:
            out.append(data[:remaining] if len(data) > remaining else data)
        self.extra += data[remaining:]
        self.remaining = 0
        self.done = True


class ChunkedDecoder:
    """The chunked transfer coding (RFC 9112 section 7.1), strictly.

    Chunk extensions are ignored (a control character in one, bare LF or NUL, is refused);
    trailer fields are read and dropped. Data after the final
    CRLF is kept in :attr:`extra` (garbage: the response is whole, the connection is not
    reused).
    """

    __slots__ = ("_buf", "_need", "_state", "done", "extra")

    # ``_state == 0`` with nothing in ``_buf``: at the start of a size line, nothing pending
    # (:meth:`gateway.h1.connection.H1Connection.data_received` decodes a read holding exactly
    # one whole chunk itself then, which leaves this state as it was).

    # States: 0 size line, 1 chunk data (_need bytes left), 2 CRLF after data, 3 trailers.
    def __init__(self) -> None:
        self._buf = b""
        self._need = 0
        self._state = 0
        self.done = False
        self.extra = b""

    def feed(self, data: bytes, out: list[bytes]) -> None:
        """Append the decoded body bytes of ``data`` to ``out``.

        Raises:
            ProtocolError: Malformed chunk size line, missing CRLF after chunk data, or a
                size line or trailer section over its limit.
        """
        if self.done:
            self.extra += data
            return
        buf = self._buf + data if self._buf else data
        self._buf = b""
        pos, end = 0, len(buf)
        while pos < end:
            state = self._state
            if state == 0:
                plain = PLAIN_SIZE_LINE.match(buf, pos)
                if plain is not None:  # one match instead of find, split and fullmatch
                    size = int(plain[1], 16)
                    pos = plain.end()
                    if size and end - pos >= size + 2:
                        if buf[pos + size:pos + size + 2] != b"\r\n":
                            raise ProtocolError("chunk data not followed by CRLF")
                        out.append(buf[pos:pos + size])
                        pos += size + 2
                        continue
                    pos = plain.start()  # the general path below reads it again
                eol = buf.find(b"\r\n", pos, pos + _MAX_CHUNK_LINE)
                if eol < 0:
                    if end - pos >= _MAX_CHUNK_LINE:
                        raise ProtocolError("chunk size line too long")
                    self._buf = buf[pos:]
                    return
                line = buf[pos:eol]
                semi = line.find(b";")
                size_text = line if semi < 0 else line[:semi].rstrip(b" \t")
                if _HEX.fullmatch(size_text) is None or (
                        semi >= 0 and _BAD_VALUE.search(line, semi) is not None):
                    raise ProtocolError(f"malformed chunk size {line[:40]!r}")
                size = int(size_text, 16)
                pos = eol + 2
                if size == 0:
                    self._state = 3
                    continue
                if end - pos >= size + 2:  # the whole chunk is here (the usual case)
                    if buf[pos + size:pos + size + 2] != b"\r\n":
                        raise ProtocolError("chunk data not followed by CRLF")
                    out.append(buf[pos:pos + size])
                    pos += size + 2
                    continue
                self._need = size
                self._state = 1
            elif state == 1:
                take = min(self._need, end - pos)
                out.append(buf[pos:pos + take])
                pos += take
                self._need -= take
                if self._need == 0:
                    self._state = 2
            elif state == 2:
                if end - pos < 2:
                    self._buf = buf[pos:]
                    return
                if buf[pos:pos + 2] != b"\r\n":
                    raise ProtocolError("chunk data not followed by CRLF")
                pos += 2
                self._state = 0
            else:
                self._trailers(buf, pos)
                return

    def _trailers(self, buf: bytes, pos: int) -> None:
        """Read the trailer section up to its empty line (then :attr:`done`)."""
        rest = buf[pos:]
        if rest.startswith(b"\r\n"):
            self.done, self.extra = True, rest[2:]
            return
        end = rest.find(b"\r\n\r\n")
        if end < 0:
            if len(rest) > _MAX_TRAILERS:
                raise ProtocolError("trailer section too long")
            self._buf = rest
            return
        if end + 4 > _MAX_TRAILERS:
            raise ProtocolError("trailer section too long")
        self.done, self.extra = True, rest[end + 4:]
