"""The text a ``data:`` URL carries (RFC 2397), for the scan.

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
"""

from __future__ import annotations

import binascii
import codecs
from urllib.parse import unquote

__all__ = ["data_url_text"]

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
    probe = payload[:_PROBE]
    try:
        head = binascii.a2b_base64(probe[: len(probe) - len(probe) % 4])
        codecs.getincrementaldecoder("utf-8")().decode(head, final=len(probe) == len(payload))
        whole = binascii.a2b_base64(payload)
    except binascii.Error:  # not base64 after all: its characters are scanned as they are
        return value, True
    except UnicodeDecodeError:
        return None
    # Text from its first bytes on: decoded whole, a stray byte further on cannot hide the rest.
    return whole.decode("utf-8", errors="replace"), False
