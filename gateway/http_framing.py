"""Request framing (RFC 9112 §6.1, §6.3, §5.2): is a request head's body framing unambiguous?

:func:`framing_problem` runs on the raw header lines of every request head the gateway's HTTP
server reads (:mod:`gateway.http_guard`), before h11 unfolds lines or merges repeated
``Content-Length`` values.
"""

from __future__ import annotations

import re

__all__ = ["framing_problem"]

_CONTENT_LENGTH = re.compile(rb"[0-9]{1,18}")
_OWS = b" \t"
_FOLD = (b" ", b"\t")
_FRAMING_NAME_LENGTHS = (len(b"content-length"), len(b"transfer-encoding"))


def framing_problem(request_line: bytes, header_lines: list[bytes] | list[bytearray]) -> str | None:
    """Why a request head has ambiguous or unsupported framing, or ``None`` when it is sound.

    Args:
        request_line: The request line (``METHOD target HTTP/x.y``), without CRLF.
        header_lines: The raw header lines, without CRLF, before any unfolding.

    Returns:
        A one-line reason for the client, or ``None``.
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
