"""The text a ``data:`` URL (RFC 2397) or a bare base64 string carries, for the scan.

A ``data:`` URL in a request (an image or audio part, a file's ``file_data``, or any string a
client chose to write that way) is forwarded as it is, so what it encodes is forwarded too. The
detector reads text, so:

* a URL without ``;base64`` carries its payload as (percent-encoded) text: scanned as it is
  when percent-decoding does not change it (a match can then be masked in place), else its
  decoded payload is scanned and a match cannot be masked in place (it is encoded);
* a ``;base64`` URL whose payload decodes to UTF-8 text (whatever media type it claims: a
  ``image/png`` label costs nothing to write) is decoded and scanned; a match in it cannot be
  masked in place;
* a ``;base64`` payload whose first bytes are not UTF-8 (PNG, JPEG, WAV, PDF...) is binary: not
  scanned (reading text out of images or audio would need OCR or transcription, not a text
  detector; text hidden inside a binary file's bytes is not found either: extracting printable
  runs cost ~16 ms per MB here). Deciding this costs a decode of its first :data:`_PROBE`
  characters only;
* a ``;base64`` payload that is not base64 is scanned as it is written.

A bare base64 string (an ``input_audio`` part's ``data``, a file part's ``file_data``, or any
string of 16 or more base64 characters) that decodes to UTF-8 text is scanned decoded as well
as written (:func:`base64_text`): text encoded by the client reaches the replica all the same.
"""

from __future__ import annotations

import binascii
import codecs
import re
from urllib.parse import unquote

__all__ = ["base64_text", "data_url_text"]

#: A string that may be base64 (standard or URL-safe alphabet, padded or not).
_BASE64 = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,2}")

#: Base64 characters decoded to tell text from binary before decoding a payload whole.
_PROBE = 8192


def data_url_text(value: str) -> tuple[str, bool] | None:
    """The text to scan for a string that starts with ``data:`` (any case).

    Args:
        value: the string (callers check the ``data:`` prefix; other strings are returned
            as they are).

    Returns:
        ``(text, in_place)``: ``in_place`` when ``text`` is ``value`` itself (offsets of a
        match are offsets in ``value``); ``None`` when the payload is binary (not scanned).
    """
    header, comma, payload = value[5:].partition(",")
    if not comma:
        return value, True
    if not header.lower().endswith(";base64"):
        decoded = unquote(payload, errors="replace")
        return (value, True) if decoded == payload else (decoded, False)
    try:
        text = _decoded(payload)
    except binascii.Error:  # not base64 after all: its characters are scanned as they are
        return value, True
    return None if text is None else (text, False)


def base64_text(value: str) -> str | None:
    """The text a bare base64 string encodes (``None``: not base64, or binary).

    Args:
        value: any string; only one made of 16 or more base64 characters is decoded.
    """
    if len(value) < 16 or not _BASE64.fullmatch(value):
        return None
    try:
        return _decoded(value.replace("-", "+").replace("_", "/"))
    except binascii.Error:
        return None


def _decoded(payload: str) -> str | None:
    """A base64 payload's text, or ``None`` when its first bytes are not UTF-8 (binary).

    Raises:
        binascii.Error: not base64.
    """
    probe = payload[:_PROBE]
    head = binascii.a2b_base64(probe[: len(probe) - len(probe) % 4])
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=len(probe) == len(payload))
    except UnicodeDecodeError:
        return None
    padded = payload + "=" * (-len(payload) % 4)
    # Text from its first bytes on: decoded whole, a stray byte further on cannot hide the rest.
    return binascii.a2b_base64(padded).decode("utf-8", errors="replace")
