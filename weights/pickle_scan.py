"""An allowlist scanner for pickle streams that never unpickles (``pickletools.genops`` only).

A pickle is a program for a stack machine (CPython ``Lib/pickletools.py`` documents every
opcode); it can call any importable callable through ``GLOBAL``/``STACK_GLOBAL``/``INST``/
``OBJ`` + ``REDUCE``. Denylist scanners (picklescan, modelscan) list known-bad callables and
are bypassed by any callable they forgot; this scanner accepts only the callables a plain
tensor state dict needs (:data:`ALLOWED_GLOBALS`) and rejects everything else, including
anything it cannot resolve statically:

* ``GLOBAL``/``INST`` arguments are ``"module name"``; ``STACK_GLOBAL`` takes module and name
  from the stack, so the scanner tracks string constants through the stack and the memo
  (``PUT``/``GET``/``MEMOIZE``); a non-constant operand is a finding.
* Dotted names (``STACK_GLOBAL('logging', 'os.system')`` reaches ``os.system`` through an
  attribute chain in protocol 4+) match only if the full dotted path is allowed.
* ``EXT1/2/4`` (the copyreg extension registry) is a finding: the callable is not named.
* A stream is scanned to its ``STOP`` and then again while another pickle follows (the legacy
  torch format writes several pickles in a row; an appended pickle is a known evasion).

The evaluation that led to writing this instead of using a library is in docs/weights.md.
"""

from __future__ import annotations

import io
import pickletools
import warnings
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

SCANNER_NAME = "sovereign-gateway pickle allowlist"
SCANNER_VERSION = "1"

#: Callables a tensor state dict written by ``torch.save`` (zip or legacy) or a NumPy array
#: needs; the list follows ``torch._weights_only_unpickler`` (torch 2.x), narrowed.
ALLOWED_GLOBALS: frozenset[str] = frozenset(
    {
        "collections.OrderedDict",
        "builtins.set",
        "builtins.frozenset",
        "builtins.slice",
        "builtins.complex",
        "_codecs.encode",
        "torch._utils._rebuild_tensor",
        "torch._utils._rebuild_tensor_v2",
        "torch._utils._rebuild_parameter",
        "torch._utils._rebuild_parameter_with_state",
        "torch.Size",
        "numpy.core.multiarray._reconstruct",
        "numpy._core.multiarray._reconstruct",
        "numpy.ndarray",
        "numpy.dtype",
    }
    | {
        f"torch.{kind}Storage"
        for kind in ("Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char",
                     "Byte", "Bool", "ComplexFloat", "ComplexDouble", "Untyped")
    }
    | {
        f"torch.{dtype}"
        for dtype in ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16",
                      "int8", "uint8", "bool", "complex64", "complex128", "float8_e4m3fn",
                      "float8_e5m2")
    }
)

#: Most pickles a stream may hold in a row (legacy torch writes five).
MAX_PICKLES = 8

_STRING_OPS = frozenset(
    {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING", "BINSTRING",
     "SHORT_BINSTRING"}
)
_MARK = object()
_UNKNOWN = object()


@dataclass(frozen=True)
class PickleVerdict:
    """What the scanner found in one pickle stream.

    Attributes:
        safe: True if every global is allowed and the stream parsed to its end.
        globals: Every callable the stream imports, as ``module.name`` (sorted, unique).
        findings: Why it is unsafe (empty when safe), e.g. ``"global os.system"``.
        pickles: How many consecutive pickles were scanned.
    """

    safe: bool
    globals: tuple[str, ...]
    findings: tuple[str, ...]
    pickles: int


class NotAPickle(ValueError):
    """The bytes do not start with a parseable pickle."""


def _scan_one(fh: BinaryIO, found: set[str], findings: list[str]) -> None:
    """Scan one pickle from the current position of ``fh`` to its STOP.

    Raises:
        NotAPickle: An opcode is invalid or the stream ends before STOP.
    """
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    try:
        for op, arg, pos in _quiet_genops(fh):
            name = op.name
            if name in ("GLOBAL", "INST"):
                module, _, attr = str(arg).partition(" ")
                found.add(f"{module}.{attr}")
            elif name == "STACK_GLOBAL":
                attr_v = stack.pop() if stack else _UNKNOWN
                module_v = stack.pop() if stack else _UNKNOWN
                if isinstance(module_v, str) and isinstance(attr_v, str):
                    found.add(f"{module_v}.{attr_v}")
                else:
                    findings.append(f"STACK_GLOBAL with non-constant operands at byte {pos}")
                stack.append(_UNKNOWN)
                continue
            elif name in ("EXT1", "EXT2", "EXT4"):
                findings.append(f"{name} {arg} (extension registry callable) at byte {pos}")
            if name in _STRING_OPS:
                stack.append(arg if isinstance(arg, str) else _UNKNOWN)
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1] if stack else _UNKNOWN
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[cast(int, arg)] = stack[-1] if stack else _UNKNOWN
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo.get(cast(int, arg), _UNKNOWN))
            else:
                _apply_effect(op, stack)
            if name == "STOP":
                return
    except ValueError as exc:  # genops: bad opcode, truncated argument, bad PUT...
        raise NotAPickle(str(exc)) from exc
    raise NotAPickle("stream ended before STOP")


def _quiet_genops(fh: Any) -> Any:
    """``pickletools.genops`` with its decoding warnings silenced: a ``STRING`` argument with
    an invalid escape warns (DeprecationWarning) but is just bytes to a scanner, and arbitrary
    data sniffed for pickles must not warn or, where warnings are errors, raise."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield from pickletools.genops(fh)


def _apply_effect(op: pickletools.OpcodeInfo, stack: list[Any]) -> None:
    """Pop and push according to the opcode's documented stack effect (values unknown)."""
    before = op.stack_before
    if pickletools.markobject in before:  # pops everything down to and including the mark
        while stack and stack.pop() is not _MARK:
            pass
        before = [s for s in before if s not in (pickletools.markobject, pickletools.stackslice)]
    for _ in before:
        if stack:
            stack.pop()
    for item in op.stack_after:
        stack.append(_MARK if item is pickletools.markobject else _UNKNOWN)


class _Capped:
    """A reader that never asks the file for more bytes than remain: ``genops`` reads an
    argument of a declared length at once, and a hostile length must not allocate memory."""

    def __init__(self, fh: BinaryIO, size: int) -> None:
        self._fh = fh
        self._size = size

    def read(self, n: int = -1) -> bytes:
        left = max(0, self._size - self._fh.tell())
        return self._fh.read(left if n < 0 else min(n, left))

    def tell(self) -> int:
        return self._fh.tell()

    def seek(self, pos: int, whence: int = 0) -> int:
        return self._fh.seek(pos, whence)

    def readline(self, size: int | None = -1) -> bytes:
        left = max(0, self._size - self._fh.tell())
        limit = left if size is None or size < 0 else min(size, left)
        return self._fh.readline(limit)


def scan_pickle_stream(fh: BinaryIO, size: int) -> PickleVerdict:
    """Scan a pickle stream (one or several consecutive pickles) from the start of ``fh``.

    Args:
        fh: A seekable binary file positioned at the first byte of the stream.
        size: Bytes of ``fh`` that belong to the stream (reads never go beyond).

    Returns:
        The verdict. Bytes after the last parseable pickle are ignored: legacy torch files
        carry raw tensor storage there, and no loader unpickles them.

    A first pickle that breaks (invalid byte, end of file) after naming a global is a verdict,
    not an error: ``pickle.load`` has imported and called what came before the break; it is
    unsafe with the finding that says so.

    Raises:
        NotAPickle: The stream does not start with a pickle.
    """
    base = fh.tell()
    capped = _Capped(fh, base + size)
    found: set[str] = set()
    findings: list[str] = []
    try:
        _scan_one(capped, found, findings)  # type: ignore[arg-type]
    except NotAPickle as exc:
        if not found and not findings:
            raise
        # pickle.load has run everything before the break (imports and calls included).
        findings.append(f"the stream breaks before its STOP ({exc}); a loader runs what came "
                        "before the break")
        findings += [f"global {g} is not allowed" for g in sorted(found - ALLOWED_GLOBALS)]
        return PickleVerdict(safe=False, globals=tuple(sorted(found)),
                             findings=tuple(findings), pickles=1)
    count = 1
    while capped.tell() < base + size:
        start = capped.tell()
        try:
            _scan_one(capped, found, findings)  # type: ignore[arg-type]
        except NotAPickle:
            capped.seek(start)
            break
        count += 1
        if count > MAX_PICKLES:
            findings.append(f"more than {MAX_PICKLES} consecutive pickles")
            break
    findings += [f"global {g} is not allowed" for g in sorted(found - ALLOWED_GLOBALS)]
    return PickleVerdict(safe=not findings, globals=tuple(sorted(found)),
                         findings=tuple(findings), pickles=count)


def scan_pickle_bytes(data: bytes) -> PickleVerdict:
    """:func:`scan_pickle_stream` over bytes held in memory.

    Raises:
        NotAPickle: ``data`` does not start with a pickle.
    """
    return scan_pickle_stream(io.BytesIO(data), len(data))


_MAX_CHAINED = 64  # pickles in a row examined while each is inert


def _dotted(name: str) -> bool:
    return bool(name) and all(part.isidentifier() for part in name.split("."))


_PUT_OPS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_GET_OPS = frozenset({"GET", "BINGET", "LONG_BINGET"})


def _imports(op: pickletools.OpcodeInfo, arg: Any, stack: list[Any]) -> bool:
    """Would an unpickler import a module at this opcode?"""
    if op.name in ("GLOBAL", "INST"):
        module, _, name = str(arg).partition(" ")
        return _dotted(module) and _dotted(name)
    if op.name == "STACK_GLOBAL" and len(stack) >= 2:
        module, name = stack[-2], stack[-1]  # str constants (else the unpickler refuses)
        return isinstance(module, str) and isinstance(name, str) and _dotted(module) \
            and _dotted(name)
    return False


def _needs(op: pickletools.OpcodeInfo, stack: list[Any]) -> bool:
    """The stack holds what ``op`` pops (an unpickler fails with "stack underflow" else)."""
    before = op.stack_before
    if pickletools.markobject in before and _MARK not in stack:
        return False
    plain = [b for b in before if b not in (pickletools.markobject, pickletools.stackslice)]
    if pickletools.markobject in before:
        top = len(stack) - 1 - stack[::-1].index(_MARK)
        return top >= len(plain)
    return len(stack) >= len(plain)


def _one_pickle(capped: _Capped) -> str:
    """Walk one pickle from the reader's position as an unpickler would, without values.

    Returns:
        ``imports``: a module would be imported (code runs at load, whatever follows);
        ``proto``: a complete one-value pickle of protocol 2 or later; ``inert``: a complete
        one-value protocol-0/1 pickle that imports nothing; ``none``: not a pickle (an invalid
        opcode or argument, a stack underflow or a missing ``STOP`` before any import).
    """
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    proto = False
    try:
        for i, (op, arg, _pos) in enumerate(_quiet_genops(cast(Any, capped))):
            if i == 0 and op.name == "PROTO":
                if not 2 <= int(arg) <= pickle_highest():
                    return "none"
                proto = True
                continue
            if not _needs(op, stack):
                return "none"
            if _imports(op, arg, stack):
                return "imports"
            if op.name == "STOP":
                if len(stack) != 1:
                    return "none"
                return "proto" if proto else "inert"
            if op.name in _PUT_OPS or op.name == "MEMOIZE":
                if not stack or stack[-1] is _MARK:
                    return "none"
                memo[len(memo) if op.name == "MEMOIZE" else int(arg)] = stack[-1]
                continue
            if op.name in _GET_OPS:
                if int(arg) not in memo:
                    return "none"  # the unpickler fails: "Memo value not found"
                stack.append(memo[int(arg)])
                continue
            _apply_effect(op, stack)
            if op.name in _STRING_OPS and isinstance(arg, str):
                stack[-1] = arg  # a str constant (a STACK_GLOBAL operand, if any)
    except ValueError:
        return "none"
    return "none"


def pickle_highest() -> int:
    """The highest pickle protocol this Python reads (``pickle.HIGHEST_PROTOCOL``)."""
    import pickle

    return pickle.HIGHEST_PROTOCOL


def is_pickle(fh: BinaryIO, size: int) -> bool:
    """True if ``fh`` (from its current position, ``size`` bytes) holds a pickle a loader would
    act on, whatever the file is called. Walking the opcodes as an unpickler would:

    * a module would be imported (``GLOBAL``/``INST`` naming a dotted module and name, or
      ``STACK_GLOBAL`` with its two operands on the stack) before the stream ends or breaks:
      ``pickle.load`` runs code there even if a later byte is invalid, so no ``STOP`` is needed;
    * or a complete one-value pickle of protocol 2 or later (``PROTO`` first: ``torch.save``,
      NumPy);
    * or an inert pickle (complete, protocol 0/1, importing nothing) directly followed by one
      of the above (the next pickles are examined while each is inert).

    An inert pickle alone is not one: random bytes form one about once in 1,400 files (``N.``
    is a complete pickle, and a weight tensor's bytes are random), and loading it could not run
    code. Text, random bytes and other binary formats fail within a few bytes. Reads are capped
    to ``size`` bytes; the position of ``fh`` is restored.
    """
    base = fh.tell()
    capped = _Capped(fh, base + size)
    try:
        for _ in range(_MAX_CHAINED):
            kind = _one_pickle(capped)
            if kind in ("imports", "proto"):
                return True
            if kind == "none" or fh.tell() >= base + size:
                return False
        return True  # a long chain of inert pickles: treat it as the pickle stream it is
    finally:
        fh.seek(base)


__all__ = [
    "ALLOWED_GLOBALS",
    "SCANNER_NAME",
    "SCANNER_VERSION",
    "NotAPickle",
    "PickleVerdict",
    "is_pickle",
    "scan_pickle_bytes",
    "scan_pickle_stream",
]
