"""Serialisation policy: which weight formats may be staged, found by name and by content.

The policy is applied here (:func:`check_format`, :func:`check_names`); the format of a file
is found by :mod:`weights.format_scan`, by the rules below. Its refusals
(:class:`~weights.errors.UnsafeSerialisationError` and subclasses) are in :mod:`weights.errors`.

Default policy (``SerialisationPolicy()``): safetensors, GGUF and plain data files only.
A pickle-based file executes code when loaded (``torch.load``, ``pickle.load``), so it is
refused at pin, lock, pull, pack and unpack with one line naming the file and the switch
``--allow-pickle``. With the switch the file is scanned by :mod:`weights.pickle_scan` (an
allowlist over ``pickletools.genops``; nothing is unpickled) and refused if unsafe; the verdict
(scanner name and version, imported callables) is recorded in the lockfile and bundle index.

A file is pickle-based if any of these holds (name alone is not enough: a renamed pickle is
the first evasion tried, and a header alone is not enough: a polyglot is the second):

* its content starts with a pickle a loader would act on (:func:`weights.pickle_scan.is_pickle`),
  whatever header it also carries: this is decided before any other format;
* its name ends in ``.bin``, ``.pt``, ``.pth``, ``.ckpt``, ``.pkl``, ``.pickle``, ``.joblib``
  and its content is not safetensors or GGUF by a full parse
  (:mod:`weights.safetensors_format`, :mod:`weights.gguf_format`);
* it is a NumPy ``.npy`` array of objects (:mod:`weights.npy_format`: its data is a pickle);
* it is a zip archive (``torch.save``'s format since torch 1.6, ``.npz``) holding a pickle, an
  array of objects or another archive (nested archives are scanned member by member, at most
  3 deep; deeper, or an encrypted member, is refused with its own code).

A file that only looks like safetensors or GGUF (its name or first bytes) but does not parse
is ``data``: the ML-BOM and lock never call it a format no loader would accept.

Sources: safetensors header layout (8-byte little-endian header length, then a JSON object;
huggingface/safetensors README); GGUF magic ``GGUF`` (ggml docs/gguf.md); zip local header
``PK\\x03\\x04`` (PKWARE APPNOTE 4.3.7).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from weights.errors import RemoteCodeRefused, UnsafeSerialisationError
from weights.format_scan import inspect_file, named_as_pickle
from weights.pickle_scan import SCANNER_NAME, SCANNER_VERSION, PickleVerdict

ALLOW_SWITCH = "--allow-pickle"
SCANNER = f"{SCANNER_NAME} {SCANNER_VERSION}"


@dataclass(frozen=True)
class SerialisationPolicy:
    """What may be staged.

    Attributes:
        allow_pickle: Accept pickle-based files that the allowlist scanner finds safe.
        allow_remote_code: Accept Python files and configs with ``auto_map`` (what
            ``trust_remote_code=True`` runs at load); refused by default.
    """

    allow_pickle: bool = False
    allow_remote_code: bool = False


#: The default policy: safetensors, GGUF and data files; every pickle refused.
DEFAULT_POLICY = SerialisationPolicy()


@dataclass(frozen=True)
class FormatVerdict:
    """The format of one file and, for pickles, the scan.

    Attributes:
        format: ``safetensors``, ``gguf``, ``pickle`` or ``data`` (anything else: JSON,
            text, tokenizers, ONNX ...; nothing in it is executed by a loader).
        scan: ``"<scanner> <version>: safe (globals ...)"`` for a scanned pickle, else None.
        pickle: The scanner's verdict for a pickle (None otherwise or when not scanned).
    """

    format: str
    scan: str | None = None
    pickle: PickleVerdict | None = None


REMOTE_CODE_SWITCH = "--allow-remote-code"
#: The largest JSON file read to look for ``auto_map``, in bytes (configs are a few KiB).
MAX_CONFIG_BYTES = 16 * 1024**2


def remote_code_reason(path: Path, label: str) -> str | None:
    """Why ``path`` is code a loader runs with ``trust_remote_code``, or None.

    A ``.py`` file is code (``modeling_*.py``, ``configuration_*.py`` ... are imported by
    transformers' dynamic module loader); a JSON file whose top-level object has ``auto_map``
    (config.json, tokenizer_config.json) names such code for ``AutoModel``/``AutoTokenizer``
    (transformers ``dynamic_module_utils``).
    """
    lower = label.lower()
    if lower.endswith(".py"):
        return "a Python file (run by trust_remote_code)"
    if not lower.endswith(".json"):
        return None
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            return None
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    if isinstance(doc, dict) and "auto_map" in doc:
        return "a config with auto_map (asks for trust_remote_code)"
    return None


def describe(verdict: PickleVerdict) -> str:
    """The one-line verdict recorded in lockfiles and indexes."""
    state = "safe" if verdict.safe else "unsafe"
    return f"{SCANNER}: {state} (globals: {', '.join(verdict.globals) or 'none'})"


def check_format(path: Path, label: str, policy: SerialisationPolicy) -> FormatVerdict:
    """Apply ``policy`` to one file.

    Args:
        path: The file on disk.
        label: How to name it in messages (``repo_id:path``).
        policy: The policy.

    Returns:
        The format and, for an allowed pickle, the recorded scan line.

    Raises:
        RemoteCodeRefused: Code ``trust_remote_code`` would run (``remote_code_reason``)
            without ``allow_remote_code``; with it, the format is ``code``.
        UnsafeSerialisationError: A pickle-based file without ``allow_pickle``, or one the
            scanner finds unsafe (message names the file and the first findings).
        OSError: The file cannot be read.
    """
    code = remote_code_reason(path, label)
    if code is not None:
        if not policy.allow_remote_code:
            raise RemoteCodeRefused(
                f"{label}: {code} refused; re-run with {REMOTE_CODE_SWITCH} to stage it (the "
                "server must then be started with trust_remote_code)", path=label)
        return FormatVerdict("code", f"remote code accepted with {REMOTE_CODE_SWITCH}")
    kind, verdict = inspect_file(path, label)
    if kind != "pickle":
        return FormatVerdict(kind)
    assert verdict is not None
    if not policy.allow_pickle:
        raise refuse_by_name(label)
    if not verdict.safe:
        raise UnsafeSerialisationError(
            f"{label}: pickle refused by {SCANNER}: {'; '.join(verdict.findings[:3])}",
            path=label,
            hint="convert it to safetensors; the scanner accepts only a plain tensor state dict",
        )
    return FormatVerdict("pickle", describe(verdict), verdict)


def refuse_by_name(label: str) -> UnsafeSerialisationError:
    """The refusal of a pickle-based file under the default policy (one line, names the switch)."""
    return UnsafeSerialisationError(
        f"{label}: pickle-based file refused (it can run code when loaded); "
        f"re-run with {ALLOW_SWITCH} to scan and accept a plain tensor state dict",
        path=label,
    )


def check_names(labels: Iterable[str], policy: SerialisationPolicy) -> None:
    """Refuse pickle-named files under the default policy, before any byte is fetched.

    Raises:
        UnsafeSerialisationError: The first pickle-named file (when not ``allow_pickle``).
    """
    if policy.allow_pickle:
        return
    for label in labels:
        if named_as_pickle(label):
            raise refuse_by_name(label)


__all__ = [
    "ALLOW_SWITCH",
    "DEFAULT_POLICY",
    "REMOTE_CODE_SWITCH",
    "SCANNER",
    "FormatVerdict",
    "SerialisationPolicy",
    "check_format",
    "check_names",
    "describe",
    "refuse_by_name",
    "remote_code_reason",
]
