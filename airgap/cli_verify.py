"""``airgap verify``'s implementation and the rendering helpers of the ``airgap`` commands.

Shared by the entry point (:mod:`airgap.cli`, whose fast parser runs :func:`run_verify`
without typer) and the typer application (:mod:`airgap.cli_app`), so that neither imports the
other back. Imports neither typer nor rich (rich loads on first use, :mod:`clishell.consoles`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airgap.bundle import INDEX_NAME, MAX_INDEX_BYTES
from airgap.errors import AirgapError, Code, Problem, VerificationFailed
from airgap.media import check_bundle_dir, read_small
from airgap.signing import load_public_key
from airgap.stream import default_workers
from airgap.verify import MAX_SHOWN_PROBLEMS, verify_bundle
from clishell import EXIT_FAILED, existing_public_key
from clishell.consoles import byte_progress, diagnostics, results
from clishell.text import escaped
from weights import EmptyModelError, Lockfile, PathCollisionError, WeightsError

if TYPE_CHECKING:
    from rich.console import Console


def err() -> Console:
    """The console on standard error (progress, diagnostics); rich is imported on first use."""
    return diagnostics()


def out() -> Console:
    """The console on standard output (results); rich is imported on first use."""
    return results()


def _progress(total: int, label: str, quiet: bool) -> contextlib.AbstractContextManager[Any]:
    """A byte-count callback drawing a rich progress bar (none if quiet or not a TTY)."""
    return byte_progress(total, label, quiet)


def _styled_stdout() -> bool:
    """Whether rich would style standard output (its ``Console.is_terminal`` rules).

    ``TTY_COMPATIBLE`` 0/1, then ``FORCE_COLOR`` (https://force-color.org/: set and not empty),
    then ``isatty()``.
    """
    tty_compatible = os.environ.get("TTY_COMPATIBLE", "")
    if tty_compatible in ("0", "1"):
        return tty_compatible == "1"
    force_color = os.environ.get("FORCE_COLOR")
    if force_color is not None:
        return force_color != ""
    try:
        return sys.stdout.isatty()
    except ValueError:  # closed
        return False


def _print_json(doc: dict[str, Any]) -> None:
    """Print a JSON document indented by 2, as rich's ``print_json`` does; plain (rich not
    loaded) unless standard output is a terminal that gets highlighting."""
    if _styled_stdout():
        out().print_json(json.dumps(doc))
    else:
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


def _print_line(text: str) -> None:
    """Print one result line; plain (rich not loaded, paths exactly as they are, no
    ``:emoji:`` codes replaced) unless standard output is a terminal that gets highlighting."""
    if _styled_stdout():
        out().print(text)
    else:
        sys.stdout.write(text + "\n")


def _load_lock(path: Path | None) -> Lockfile | None:
    if path is None:
        return None
    try:
        return Lockfile.load(path)
    except PathCollisionError as exc:
        raise AirgapError(Code.PATH_COLLISION, exc.message) from exc
    except EmptyModelError as exc:
        raise AirgapError(Code.EMPTY_MODEL, exc.message) from exc
    except WeightsError as exc:
        raise AirgapError(Code.LOCK_INVALID, str(exc)) from exc


def _trusted_keys(paths: Sequence[Path]) -> list[Any]:
    """Load the ``--public-key`` files (an old ``KEY.pub.pem`` name is still found)."""
    return [load_public_key(existing_public_key(p, "airgap")) for p in paths]


def _workers(n: int) -> int:
    return n or default_workers()


def _peek_payload(bundle: Path) -> int:
    """Payload size from an (unverified) index, for the progress bar only.

    A scan for the one field, not a JSON parse: the index is not trusted yet, and parsing a
    hostile 40 MB index would cost more than refusing it does (docs/airgap.md)."""
    try:
        data = read_small(bundle, INDEX_NAME, MAX_INDEX_BYTES, Code.INDEX_MISSING)
    except VerificationFailed:
        return 0
    found = re.search(rb'"payload_size"\s*:\s*(\d{1,19})', data)
    return int(found.group(1)) if found else 0


def _shows_progress(quiet: bool) -> bool:
    return not quiet and err().is_terminal


def run_verify(
    bundle: Path,
    public_key: Sequence[Path],
    expected_lock: Path | None = None,
    all_parts: bool = False,
    as_json: bool = False,
    workers: int = 0,
    quiet: bool = False,
) -> int:
    """``airgap verify``: check a bundle offline and print the report (see the command's help).

    Args:
        bundle: Bundle directory.
        public_key: Trusted Ed25519 public key files.
        expected_lock: Also require the bundle's pins to equal this lockfile.
        all_parts: Also hash every part whole.
        as_json: Print the JSON report instead of the text lines.
        workers: Hashing threads (0 = one per core).
        quiet: No progress bar.

    Returns:
        0 if the bundle is trusted, else 1 (its problems printed).

    Raises:
        AirgapError: An unreadable key, bundle directory or lockfile (exit 2).
    """
    keys = _trusted_keys(public_key)
    check_bundle_dir(bundle)
    total = _peek_payload(bundle) if _shows_progress(quiet or as_json) else 0
    with _progress(total, "verifying", quiet or as_json) as progress:
        report = verify_bundle(bundle, keys, expected_lock=_load_lock(expected_lock),
                               workers=_workers(workers), all_parts=all_parts,
                               progress=progress)  # fmt: skip
    if as_json:
        _print_json(report.to_json())
    elif report.ok:
        rate = report.bytes_hashed / max(report.seconds, 1e-9) / 1024**3
        _print_line(f"OK {bundle}: signed by {report.signer}, {report.bytes_hashed} bytes "
                    f"verified in {report.seconds:.1f} s ({rate:.2f} GiB/s)")  # fmt: skip
    else:
        _print_problems(report.problems, "FAIL ")
    return 0 if report.ok else EXIT_FAILED




def _print_problems(problems: Sequence[Problem], prefix: str) -> None:
    """The first ``MAX_SHOWN_PROBLEMS`` problems, one line each, then how many more."""
    for p in problems[:MAX_SHOWN_PROBLEMS]:
        err().print(f"{prefix}{p.code}: {problem_text(p)}", markup=False, highlight=False)
    if len(problems) > MAX_SHOWN_PROBLEMS:
        err().print(f"{prefix}... and {len(problems) - MAX_SHOWN_PROBLEMS} more problem(s) "
                  f"({len(problems)} in all; fix these first)", markup=False, highlight=False)


def problem_detail(p: Problem) -> str:
    """`` (expected X, got Y)`` unless the message already says so."""
    if p.expected is None or p.expected in p.message:
        return ""
    return f" (expected {p.expected}, got {p.actual})"


def problem_text(p: Problem) -> str:
    """A problem's message and detail as one terminal line.

    A message can carry text from the bundle or the media (a part's file name, an ML-BOM or
    OCI layer value, a signed-but-hostile packer's string): every control or bidirectional
    character is escaped (:func:`clishell.text.escaped`), so no line break, ESC sequence or
    reordering reaches the operator's terminal and no ``OK ...`` line can be forged.
    """
    return escaped(f"{p.message}{problem_detail(p)}")
