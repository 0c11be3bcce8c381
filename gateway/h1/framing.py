"""HTTP/1.1 framing without I/O, both ways: the one strict framing core of :mod:`gateway.h1`.

Requests (the server side, :mod:`gateway.h1.server`)
----------------------------------------------------

:class:`RequestReader` is fed the bytes a client sends and returns, one at a time, the events
of the request it carries (:class:`RequestHead`, then body bytes), or raises
:class:`RequestRefused` with the status and error code the server answers with before it closes
the connection. After the last body bytes :attr:`RequestReader.complete` is true. It never
reads a second request until :meth:`RequestReader.next_request` is called (the server's
response to the first one is complete): pipelined bytes wait in its buffer.

Strict where a gateway must be (RFC 9112; each difference from h11, the oracle of
tests/gateway/test_h1_request_differential.py, is named there):

* lines end with CRLF; a bare LF or CR in a head is refused (h11 accepts a bare LF);
* empty lines (CRLF or LF) before a request line are ignored (RFC 9112 §2.2);
* the request line is ``token SP target SP HTTP/1.0|1.1`` (other versions are refused: 505);
* header lines are ``token ":" OWS value OWS`` with a value of visible characters, SP and HTAB;
  obsolete line folding is refused, not unfolded; an HTTP/1.1 request has one ``Host``;
* ``Content-Length`` once, 1-18 decimal digits; ``Transfer-Encoding`` once, exactly
  ``chunked``, not with ``Content-Length`` and not in HTTP/1.0 (request smuggling, RFC 9112
  §6.1, §6.3), see :func:`framing_problem`;
* the head, empty lines before it included, is at most ``max_head_bytes`` (431), however it
  is split across reads;
* a chunked body: size lines of hex digits, chunk extensions without control characters (CR,
  LF, NUL, DEL ... are refused; HTAB is allowed), CRLF after each chunk's data, trailers read
  as header lines and dropped; a body known to exceed ``body_limit`` (the announced size, even
  before its size line is complete) is refused with 413 at once.

Responses (the upstream client, :mod:`gateway.h1.client`)
-------------------------------------------------------------

The status line and headers, and the body's length.

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
    "MAX_REQUEST_HEAD_BYTES",
    "PLAIN_SIZE_LINE",
    "ChunkedDecoder",
    "Head",
    "LengthDecoder",
    "ProtocolError",
    "RequestHead",
    "RequestReader",
    "RequestRefused",
    "framing_problem",
    "parse_head",
    "parse_request_head",
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
# One field line, as text decoded as latin-1 (byte for byte): a token name, ":", the value
# without surrounding SP/HTAB (no control characters but HTAB), CRLF. The same rules as
# _TOKEN and _BAD_VALUE line by line.
_FIELD_NAME = "[!#$%&'*+\\-.^_`|~0-9A-Za-z]+"
_FIELD_VALUE = "(?:[\t\x20-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?"
_FIELD_SECTION = re.compile(f"(?:{_FIELD_NAME}:[ \t]*{_FIELD_VALUE}[ \t]*\r\n)*\r\n")
_FIELD = re.compile(f"({_FIELD_NAME}):[ \t]*({_FIELD_VALUE})[ \t]*\r\n")


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
    eol = raw.find(b"\r\n")
    if eol < 0:
        eol = len(raw)  # no line end: the status line is checked, then the end is missing
    match = _STATUS_LINE.fullmatch(raw, 0, eol)
    if match is None:
        raise ProtocolError(f"malformed status line {raw[:eol][:80]!r}")
    # The usual head, in two passes of the regex engine over the whole field section instead
    # of several calls per line: every line a valid field line, then their names and values.
    # Anything else takes the line-by-line path below, which names the bad line.
    fields = raw[eol + 2 :].decode("latin-1")
    if _FIELD_SECTION.fullmatch(fields) is not None:
        headers: dict[str, str] = {}
        for name, text in _FIELD.findall(fields):
            key = name.lower()
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
    else:
        headers = _field_lines(raw.split(b"\r\n"))
    return _head(match, headers)


def _field_lines(lines: list[bytes]) -> dict[str, str]:
    """The fields of a head's lines (status line first), one line at a time.

    Raises:
        ProtocolError: The first malformed field line, or no final empty line.
    """
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
    return headers


def _head(match: re.Match[bytes], headers: dict[str, str]) -> Head:
    """The :class:`Head` of a parsed status line and fields (framing checks included)."""
    version = "1.1" if match.group(1) == b"1" else "1.0"
    status = int(match.group(2))
    tokens = headers.get("connection")
    if tokens is None:
        keep_alive = version == "1.1"
    else:
        connection = {t.strip().lower() for t in tokens.split(",")}
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
        declared = headers["content-length"]
        if "," not in declared:
            only = declared.strip().encode()
        else:
            values = {v.strip() for v in declared.split(",")}
            if len(values) != 1:
                raise ProtocolError("conflicting Content-Length values")
            only = values.pop().encode()
        if _DIGITS.fullmatch(only) is None:
            raise ProtocolError(f"invalid Content-Length {only[:40]!r}")
        length = int(only)
    if status < 200 or status in (204, 304):  # Head.bodyless
        chunked, length = False, 0
    elif not chunked and length is None:
        keep_alive = False  # delimited by the close of the connection
    return Head(status, version, headers, length, chunked, keep_alive)


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
    # (:meth:`gateway.h1.client.H1Connection.data_received` decodes a read holding exactly
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


# --- Requests (the server side): the strict request-head parser and the body reader. -------

MAX_REQUEST_HEAD_BYTES = 16 * 1024
"""Longest request head accepted by default (bytes, request line to the empty line included:
h11's default limit)."""

_TOKEN_PATTERN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_REQUEST_LINE = re.compile(
    rb"(" + _TOKEN_PATTERN + rb") ([\x21-\x7e\x80-\xff]+) HTTP/([0-9])\.([0-9])")
_HEADER_LINE = re.compile(
    rb"(" + _TOKEN_PATTERN + rb"):[ \t]*((?:[\x21-\x7e\x80-\xff](?:[\t\x20-\x7e\x80-\xff]*"
    rb"[\x21-\x7e\x80-\xff])?)?)[ \t]*")
# A whole valid header line with the CRLF before it (searched from the request line's end).
_HEADER_FIELD = re.compile(rb"\r\n" + _HEADER_LINE.pattern + rb"(?=\r\n|\Z)")
_CONTENT_LENGTH = re.compile(rb"[0-9]{1,18}")
_LEADING_EMPTY = re.compile(rb"(?:\r?\n)+")
_HEX_PREFIX = re.compile(rb"[0-9A-Fa-f]*")
_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})([ \t]*;[\t\x20-\x7e\x80-\xff]*)?")
_MAX_SIZE_LINE = 1024
_OWS = b" \t"
_EMPTY_LINE_START = (b"\r", b"\n")
_FOLD = (b" ", b"\t")
_FRAMING_NAME_LENGTHS = (len(b"content-length"), len(b"transfer-encoding"))


class RequestRefused(Exception):
    """The request cannot be served: answer ``status`` and close the connection.

    Attributes:
        status: 400 (malformed or ambiguous), 413 (body over the limit), 431 (head over the
            limit) or 505 (HTTP version).
        code: The OpenAI error ``code`` (``invalid_framing``, ``invalid_http_request``,
            ``request_too_large``, ``request_header_too_large``).
        reason: One line for the client, never echoing its bytes.
    """

    def __init__(self, status: int, code: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.code = code
        self.reason = reason


@dataclass(slots=True)
class RequestHead:
    """A parsed request head.

    Attributes:
        method: The method token, as sent.
        target: The request target, as sent (percent-escapes not decoded).
        version: ``b"1.0"`` or ``b"1.1"``.
        headers: ``(lower-case name, value)`` in the order sent, values without surrounding
            whitespace.
        content_length: The body length in bytes (0 without a body), ``None`` when chunked.
        keep_alive: The connection may carry another request after this exchange (HTTP/1.1
            without ``Connection: close``; HTTP/1.0 never, as h11 decides).
        expect_continue: The client waits for ``100 Continue`` before sending its body.
    """

    method: bytes
    target: bytes
    version: bytes
    headers: list[tuple[bytes, bytes]]
    content_length: int | None
    keep_alive: bool
    expect_continue: bool

    @property
    def chunked(self) -> bool:
        """The body uses the chunked transfer coding."""
        return self.content_length is None


def framing_problem(request_line: bytes, header_lines: list[bytes]) -> str | None:
    """Why a request head has ambiguous or unsupported body framing, or ``None`` when sound.

    Args:
        request_line: The request line (``METHOD target HTTP/x.y``), without CRLF.
        header_lines: The raw header lines, without CRLF, before any interpretation.

    Returns:
        A one-line reason for the client (RFC 9112 §6.1, §6.3, §5.2), or ``None``.
    """
    lengths = 0
    encodings = 0
    for line in header_lines:
        if line[:1] in _FOLD:
            return "obsolete line folding (a header line starting with whitespace) is refused"
        colon = line.find(b":")
        if colon not in _FRAMING_NAME_LENGTHS:  # cheap filter: only two names matter here
            continue
        name = line[:colon].lower()
        if name == b"content-length":
            lengths += 1
            if lengths > 1:
                return "repeated Content-Length header"
            if _CONTENT_LENGTH.fullmatch(line[colon + 1 :].strip(_OWS)) is None:
                return "Content-Length must be one decimal number"
        elif name == b"transfer-encoding":
            encodings += 1
            if encodings > 1:
                return "repeated Transfer-Encoding header"
            if line[colon + 1 :].strip(_OWS).lower() != b"chunked":
                return "Transfer-Encoding other than a single 'chunked' is not supported"
    if encodings and lengths:
        return "both Content-Length and Transfer-Encoding are present"
    if encodings and request_line.endswith(b"HTTP/1.0"):
        return "Transfer-Encoding in an HTTP/1.0 request"
    return None


def _bad(reason: str) -> RequestRefused:
    return RequestRefused(400, "invalid_http_request", f"Invalid HTTP request: {reason}.")


def _too_large(limit: int) -> RequestRefused:
    return RequestRefused(413, "request_too_large",
                          f"Request body exceeds the limit of {limit} bytes.")


def parse_request_head(raw: bytes) -> RequestHead:
    """Parse one request head: the request line and header lines, ``raw`` without the final
    empty line's CRLF CRLF (and without empty lines before the request line).

    Raises:
        RequestRefused: Malformed, ambiguous or unsupported (see the module docstring).
    """
    pairs = raw.count(b"\r\n")  # every CR and every LF in a CRLF pair: counted, not copied
    if raw.count(b"\r") != pairs or raw.count(b"\n") != pairs:
        raise _bad("a line not ended by CRLF")
    # The usual head, in two calls of the regex engine instead of several per line: the
    # request line, then every valid header line's name and value. Each match starts at a
    # line's CRLF and ends at the next (or the end): as many matches as header lines means
    # every line is a valid field line. A head that is not plain (a Transfer-Encoding, a
    # repeated or odd Content-Length, Host not once, another version, any malformed line)
    # takes the line-by-line path, which names the problem in the order it always did.
    eol = raw.find(b"\r\n")
    if eol < 0:
        eol = len(raw)
    start = _REQUEST_LINE.fullmatch(raw, 0, eol)
    if start is not None:
        fields = _HEADER_FIELD.findall(raw, eol)
        if len(fields) == pairs:  # one CRLF before each header line
            head = _plain_head(start, fields)
            if head is not None:
                return head
    return _parse_request_lines(raw)


def _plain_head(start: re.Match[bytes], fields: list[tuple[bytes, bytes]]) -> RequestHead | None:
    """The head of a valid request line and valid header lines, or ``None`` when it is not
    plain (:func:`parse_request_head` then parses it line by line)."""
    method, target, major, minor = start.groups()
    if major != b"1" or minor not in (b"0", b"1"):
        return None
    version = b"1." + minor
    headers: list[tuple[bytes, bytes]] = []
    length = 0
    lengths = 0
    hosts = 0
    close = version == b"1.0"
    expect = False
    for raw_name, value in fields:
        name = raw_name.lower()
        if name == b"content-length":
            lengths += 1
            if lengths > 1 or _CONTENT_LENGTH.fullmatch(value) is None:
                return None
            length = int(value)
        elif name == b"transfer-encoding":
            return None
        elif name == b"host":
            hosts += 1
        elif name == b"connection":
            if b"close" in [t.strip(_OWS).lower() for t in value.split(b",")]:
                close = True
        elif name == b"expect":
            expect = value.lower() == b"100-continue"
        headers.append((name, value))
    if version == b"1.1" and hosts != 1:
        return None
    return RequestHead(method, target, version, headers, length, not close,
                       expect and version == b"1.1" and length > 0)


def _parse_request_lines(raw: bytes) -> RequestHead:
    """:func:`parse_request_head` line by line (any head; the one that names its problem)."""
    lines = raw.split(b"\r\n")
    problem = framing_problem(lines[0], lines[1:])
    if problem is not None:
        raise RequestRefused(400, "invalid_framing", f"Invalid HTTP request framing: {problem}.")
    start = _REQUEST_LINE.fullmatch(lines[0])
    if start is None:
        raise _bad("illegal request line")
    method, target, major, minor = start.groups()
    if major != b"1" or minor not in (b"0", b"1"):
        raise RequestRefused(505, "invalid_http_request",
                             "HTTP version not supported: use HTTP/1.1.")
    version = b"1." + minor
    headers: list[tuple[bytes, bytes]] = []
    length = 0
    chunked = False
    hosts = 0
    close = version == b"1.0"
    expect = False
    match_line = _HEADER_LINE.fullmatch
    for line in lines[1:]:
        field = match_line(line)
        if field is None:
            raise _bad("illegal header line")
        name = field[1].lower()
        value = field[2]
        if name == b"content-length":
            length = int(value)  # framing_problem checked its digits
        elif name == b"transfer-encoding":
            chunked = True
        elif name == b"host":
            hosts += 1
        elif name == b"connection":
            if b"close" in [t.strip(_OWS).lower() for t in value.split(b",")]:
                close = True
        elif name == b"expect":
            expect = value.lower() == b"100-continue"
        headers.append((name, value))
    if version == b"1.1" and hosts != 1:
        raise _bad("Missing mandatory Host: header" if not hosts else
                   "Found multiple Host: headers")
    content_length = None if chunked else length
    return RequestHead(method, target, version, headers, content_length, not close,
                       expect and version == b"1.1" and (chunked or length > 0))


class RequestReader:
    """The events of the requests a client sends on one connection.

    Feed bytes with :meth:`feed`; take events with :meth:`next_event` until it returns
    ``None`` (more bytes needed, or the request is complete and :meth:`next_request` was not
    called yet). Events: one :class:`RequestHead`, then non-empty ``bytes`` of the body;
    :attr:`complete` once the whole request was read.

    Args:
        max_head_bytes: Longest request head, in bytes (431 beyond).
        body_limit: Largest request body, in bytes; a chunked body known to exceed it is
            refused (413) as soon as a size line announces it. A ``Content-Length`` body is
            left to the application (it answers with its own 413 before reading).
    """

    __slots__ = ("_buf", "_chunk_left", "_length_left", "_state", "_taken", "body_limit",
                 "head", "max_head_bytes")

    # States: 0 head, 1 Content-Length body, 2 chunk size line, 3 chunk data, 4 CRLF after
    # chunk data, 5 trailers, 6 request complete (waiting for next_request).
    def __init__(self, max_head_bytes: int = MAX_REQUEST_HEAD_BYTES,
                 body_limit: int = 2**62) -> None:
        self.max_head_bytes = max_head_bytes
        self.body_limit = body_limit
        self.head: RequestHead | None = None
        self._buf = b""
        self._state = 0
        self._length_left = 0
        self._chunk_left = 0
        self._taken = 0  # body bytes of this request returned so far

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as events (a part of a head, pipelined bytes)."""
        return len(self._buf)

    @property
    def reading_head(self) -> bool:
        """Waiting for (part of) a request head: no request in progress."""
        return self._state == 0

    @property
    def complete(self) -> bool:
        """The current request, body included, was wholly read."""
        return self._state == 6

    @property
    def body_left(self) -> int | None:
        """Bytes of the current request's body not yet returned as events: the rest of a
        ``Content-Length`` body (``0`` once the request is complete), ``None`` while a
        chunked body is read (its length is not known until its last chunk)."""
        state = self._state
        if state == 1:
            return self._length_left
        return None if 2 <= state <= 5 else 0

    def feed(self, data: bytes) -> None:
        """Add bytes received from the client."""
        self._buf = self._buf + data if self._buf else data

    def next_request(self) -> None:
        """Start reading the next request (the response to the current one is complete)."""
        self.head = None
        self._state = 0
        self._taken = 0

    def next_event(self) -> RequestHead | bytes | None:
        """The next event of the current request, or ``None`` (more bytes needed, or the
        request is complete).

        Raises:
            RequestRefused: The request is malformed, ambiguous, or over a limit; the reader
                must not be used again.
        """
        state = self._state
        if state == 0:
            return self._read_head()
        if state == 1:
            return self._read_length()
        if state == 6:
            return None
        return self._read_chunked()

    def _read_head(self) -> RequestHead | None:
        buf = self._buf
        if not buf:
            return None
        end = buf.find(b"\r\n\r\n")
        if buf[:1] in _EMPTY_LINE_START:
            # RFC 9112 §2.2: empty lines before a request line are ignored (a client may end
            # a body with an extra CRLF), however many (they are dropped, not kept).
            empty = _LEADING_EMPTY.match(buf)
            skip = empty.end() if empty is not None else 0
            if skip:
                buf = self._buf = buf[skip:]
                end = buf.find(b"\r\n\r\n")
            if not buf or buf == b"\r":
                return None
        if end < 0:
            if len(buf) > self.max_head_bytes:
                raise RequestRefused(431, "request_header_too_large", self._head_too_large())
            if b"\n" in buf.replace(b"\r\n", b"").rstrip(b"\r"):
                raise _bad("a line not ended by CRLF")
            return None
        if end + 4 > self.max_head_bytes:
            raise RequestRefused(431, "request_header_too_large", self._head_too_large())
        head = parse_request_head(buf[:end])
        self._buf = buf[end + 4 :]
        self.head = head
        if head.content_length is None:
            self._state = 2
        elif head.content_length:
            self._state = 1
            self._length_left = head.content_length
        else:
            self._state = 6
        return head

    def _head_too_large(self) -> str:
        return (f"The request line and headers are larger than the limit of "
                f"{self.max_head_bytes} bytes.")

    def _read_length(self) -> bytes | None:
        buf = self._buf
        if not buf:
            return None
        left = self._length_left
        if len(buf) <= left:
            self._buf = b""
            data = buf
        else:
            data, self._buf = buf[:left], buf[left:]
        self._length_left = left - len(data)
        if not self._length_left:
            self._state = 6
        self._taken += len(data)
        return data

    def _read_chunked(self) -> bytes | None:
        while True:
            state = self._state
            buf = self._buf
            if state == 2:
                eol = buf.find(b"\r\n", 0, _MAX_SIZE_LINE + 2)
                if eol < 0:
                    digits = _HEX_PREFIX.match(buf)
                    assert digits is not None
                    if digits.end() > 16 or (
                            digits.end() and int(buf[:digits.end()], 16) > self._left()):
                        raise _too_large(self.body_limit)
                    if len(buf) > _MAX_SIZE_LINE:
                        raise _bad("chunk size line too long")
                    if b"\n" in buf or b"\x00" in buf or b"\x7f" in buf or (
                            b"\r" in buf[:-1]):
                        raise _bad("malformed chunk size line")
                    return None
                line = buf[:eol]
                size_line = _SIZE_LINE.fullmatch(line)
                if size_line is None:
                    digits = _HEX_PREFIX.match(line)
                    assert digits is not None
                    if digits.end() > 16:
                        raise _too_large(self.body_limit)
                    raise _bad("malformed chunk size line")
                size = int(size_line[1], 16)
                self._buf = buf[eol + 2 :]
                if size == 0:
                    self._state = 5
                    continue
                if size > self._left():
                    raise _too_large(self.body_limit)
                self._chunk_left = size
                self._state = 3
            elif state == 3:
                if not buf:
                    return None
                left = self._chunk_left
                if len(buf) <= left:
                    data, self._buf = buf, b""
                else:
                    data, self._buf = buf[:left], buf[left:]
                self._chunk_left = left - len(data)
                if not self._chunk_left:
                    self._state = 4
                self._taken += len(data)
                return data
            elif state == 4:
                if len(buf) < 2:
                    if buf and buf != b"\r":
                        raise _bad("chunk data not followed by CRLF")
                    return None
                if buf[:2] != b"\r\n":
                    raise _bad("chunk data not followed by CRLF")
                self._buf = buf[2:]
                self._state = 2
            elif state == 5:
                self._read_trailers()
                return None
            else:
                return None

    def _left(self) -> int:
        return self.body_limit - self._taken

    def _read_trailers(self) -> None:
        buf = self._buf
        if buf[:2] == b"\r\n":
            self._buf = buf[2:]
            self._state = 6
            return None
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > self.max_head_bytes:
                raise RequestRefused(431, "request_header_too_large", self._head_too_large())
            return None
        if end + 4 > self.max_head_bytes:
            raise RequestRefused(431, "request_header_too_large", self._head_too_large())
        for line in buf[:end].split(b"\r\n"):
            if _HEADER_LINE.fullmatch(line) is None or b"\n" in line or b"\r" in line:
                raise _bad("malformed trailer line")
        self._buf = buf[end + 4 :]
        self._state = 6
        return None
