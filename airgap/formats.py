"""The serialisation policy at the air gap: refuse pickle-based weights in pack and unpack.

``pack`` reads every model file's content (:func:`weights.serialisation.check_format`): a
pickle (by name or content) is refused unless ``allow_pickle`` and the allowlist scanner
finds it safe; the scanner's verdict line is written into the lock carried by the signed
index (``files[].scan``), so the far side sees who scanned what with which version.

``unpack`` decides before anything is written, from the signed index alone: a file named as
a pickle, or carrying a scan verdict, is refused unless ``allow_pickle``, and even then only
with a recorded ``safe`` verdict of this scanner (a bundle from another packer, or one packed
before the policy, must be re-packed). Then, once the blobs are staged and verified and before
anything is committed, their content is checked too (``check_staged_formats``): a pickle under
an innocent name is refused even when the signed index says nothing about it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from airgap.bundle import Index
from airgap.errors import Code, Problem, VerificationFailed
from weights import (
    ALLOW_SWITCH,
    REMOTE_CODE_SWITCH,
    SCANNER,
    LockEntry,
    Lockfile,
    SerialisationPolicy,
    UnsafeSerialisationError,
    check_format,
    named_as_pickle,
)

REMOTE_CODE = "remote code accepted"


def _refused(exc: UnsafeSerialisationError) -> VerificationFailed:
    text = exc.message + (f"; {exc.hint}" if exc.hint else "")
    code = exc.code if exc.code != UnsafeSerialisationError.code else str(Code.UNSAFE_SERIALISATION)
    return VerificationFailed([Problem(code, text, path=exc.path)])


def check_pack_sources(
    lock: Lockfile, origins: dict[tuple[str, str], Path], policy: SerialisationPolicy
) -> tuple[Lockfile, dict[tuple[str, str], str]]:
    """Apply ``policy`` to every model file about to be packed.

    Args:
        lock: The pins being packed.
        origins: ``(repo_id, path)`` -> the file on disk.
        policy: The serialisation policy.

    Returns:
        ``lock`` with each accepted pickle's scan verdict recorded (``LockedFile.scan``), and
        the format found for each ``(repo_id, path)`` (safetensors, gguf, pickle, data).

    Raises:
        VerificationFailed: ``unsafe_serialisation`` naming the file and ``--allow-pickle``.
        OSError: A source cannot be read.
    """
    entries: list[LockEntry] = []
    formats: dict[tuple[str, str], str] = {}
    for entry in lock.entries:
        files = []
        for pin in entry.files:
            label = f"{entry.repo_id}:{pin.path}"
            try:
                verdict = check_format(origins[(entry.repo_id, pin.path)], label, policy)
            except UnsafeSerialisationError as exc:
                raise _refused(exc) from exc
            formats[(entry.repo_id, pin.path)] = verdict.format
            files.append(replace(pin, scan=verdict.scan) if verdict.scan else pin)
        entries.append(replace(entry, files=tuple(files)))
    return Lockfile(entries=tuple(entries)), formats


def check_index_formats(index: Index, policy: SerialisationPolicy) -> None:
    """Refuse, before anything is written, a bundle whose index holds a pickle the policy
    does not accept (see the module docstring).

    Raises:
        VerificationFailed: ``unsafe_serialisation`` for every such file.
    """
    problems = []
    for entry in index.lock.entries:
        for pin in entry.files:
            label = f"{entry.repo_id}:{pin.path}"
            if pin.path.lower().endswith(".py") or (pin.scan or "").startswith(REMOTE_CODE):
                if not policy.allow_remote_code:
                    problems.append(Problem(
                        "remote_code", f"{label}: code run by trust_remote_code refused; re-run "
                        f"with {REMOTE_CODE_SWITCH} to install it", path=label))
                continue
            if not (named_as_pickle(pin.path) or pin.scan is not None):
                continue
            if not policy.allow_pickle:
                msg = (f"{label}: pickle-based file refused (it can run code when loaded); "
                       f"re-run with {ALLOW_SWITCH} to accept one the packer's scan found safe")
            elif pin.scan is None or not pin.scan.startswith(f"{SCANNER}: safe "):
                msg = (f"{label}: pickle without a safe verdict of {SCANNER} in the signed "
                       f"index (recorded: {pin.scan or 'none'}); re-pack it with {ALLOW_SWITCH}")
            else:
                continue
            problems.append(Problem(str(Code.UNSAFE_SERIALISATION), msg, path=label))
    if problems:
        raise VerificationFailed(problems)


def check_staged_formats(
    index: Index, staged: dict[str, Path], policy: SerialisationPolicy
) -> None:
    """Apply ``policy`` to the content of every staged model blob, before it is committed.

    Catches what the index cannot show: a pickle under an innocent name in a bundle whose
    packer recorded no verdict. Reads a few bytes per blob (a header, or the first invalid
    pickle opcode); a scanned pickle is read whole.

    Args:
        index: The verified index.
        staged: sha256 -> staged file (``unpack``'s staging area).
        policy: The serialisation policy.

    Raises:
        VerificationFailed: ``unsafe_serialisation`` for every refused file.
    """
    problems: list[Problem] = []
    seen: set[str] = set()
    for f in index.files:
        if f.repo_id is None or f.sha256 not in staged or f.sha256 in seen:
            continue
        seen.add(f.sha256)
        try:
            check_format(staged[f.sha256], f.label, policy)
        except UnsafeSerialisationError as exc:
            problems.extend(_refused(exc).problems)
    if problems:
        raise VerificationFailed(problems)


__all__ = ["check_index_formats", "check_pack_sources", "check_staged_formats"]
