"""Reading a ``weights.lock`` document: every field checked, errors naming file and JSON path.

:func:`parse_entries` turns the decoded JSON of a lockfile into its entries; the whole-file
invariants (one entry per repo id, no empty model, no install-path collision) are checked when
:class:`weights.lockfile.Lockfile` is built from them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from clishell import UNSAFE_TEXT
from weights.errors import LockfileError
from weights.lockentry import LockedFile, LockEntry, Origin
from weights.lockvalues import (
    HEX40,
    HEX64,
    REPO_ID,
    TIMESTAMP,
    UNSAFE_TEXT_WHY,
    check_repo_path,
    repo_id_problem,
)

__all__ = ["parse_entries"]


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, what: str) -> LockfileError:
        return LockfileError(f"{self.source}: {where}: {what}")

    def obj(self, value: Any, where: str, keys: Iterable[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, "expected an object")
        missing = [k for k in keys if k not in value]
        if missing:
            raise self.fail(f"{where}.{missing[0]}", "missing field")
        return value

    def string(self, value: Any, where: str, pattern: re.Pattern[str] | None = None) -> str:
        if not isinstance(value, str):
            raise self.fail(where, f"expected a string, got {type(value).__name__}")
        if UNSAFE_TEXT.search(value) is not None:
            raise self.fail(where, f"{value!r}: {UNSAFE_TEXT_WHY}")
        if pattern is not None and pattern.fullmatch(value) is None:
            raise self.fail(where, f"malformed value {value!r}")
        return value

    def opt_string(
        self, value: Any, where: str, pattern: re.Pattern[str] | None = None
    ) -> str | None:
        return None if value is None else self.string(value, where, pattern)

    def boolean(self, value: Any, where: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(where, f"expected true or false, got {value!r}")
        return value


def parse_entries(doc: Any, source: str, version: int) -> list[LockEntry]:
    """The entries of a lockfile document (``json.loads`` of its text), every field checked.

    Args:
        doc: The decoded JSON document.
        source: Name used in error messages (usually the file path).
        version: The one lockfile version accepted.

    Raises:
        LockfileError: Wrong version or an invalid field; the message names ``source`` and the
            JSON path of the field (e.g. ``$.models[0].files[2].sha256``).
    """
    p = _Parser(source)
    root = p.obj(doc, "$", ("version", "models"))
    if root["version"] != version:
        raise p.fail("$.version", f"unsupported lockfile version {root['version']!r}")
    models = root["models"]
    if not isinstance(models, list):
        raise p.fail("$.models", "expected an array")
    entries: list[LockEntry] = []
    seen: set[str] = set()
    for i, raw in enumerate(models):
        where = f"$.models[{i}]"
        m = p.obj(raw, where, ("repo_id", "requested_revision", "commit", "files"))
        repo_id = p.string(m["repo_id"], f"{where}.repo_id")
        if (why := repo_id_problem(repo_id)) is not None:
            raise p.fail(f"{where}.repo_id", f"{repo_id!r}: {why}")
        if repo_id in seen:
            raise p.fail(f"{where}.repo_id", f"duplicate entry for {repo_id!r}")
        seen.add(repo_id)
        files_raw = m["files"]
        if not isinstance(files_raw, list):
            raise p.fail(f"{where}.files", "expected an array")
        files: list[LockedFile] = []
        paths: set[str] = set()
        for j, fraw in enumerate(files_raw):
            fw = f"{where}.files[{j}]"
            f = p.obj(fraw, fw, ("path", "size", "sha256", "lfs"))
            path = p.string(f["path"], f"{fw}.path")
            try:
                check_repo_path(path)
            except ValueError as exc:
                raise p.fail(f"{fw}.path", str(exc)) from None
            if path in paths:
                raise p.fail(f"{fw}.path", f"duplicate file {path!r}")
            paths.add(path)
            size = f["size"]
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise p.fail(f"{fw}.size", f"expected a non-negative integer, got {size!r}")
            files.append(
                LockedFile(
                    path=path,
                    size=size,
                    sha256=p.string(f["sha256"], f"{fw}.sha256", HEX64),
                    git_sha1=p.opt_string(f.get("git_sha1"), f"{fw}.git_sha1", HEX40),
                    lfs=p.boolean(f["lfs"], f"{fw}.lfs"),
                    scan=p.opt_string(f.get("scan"), f"{fw}.scan"),
                )
            )
        revision = p.string(m["requested_revision"], f"{where}.requested_revision")
        try:  # it becomes refs/<revision> in a cache: it must not leave refs/
            check_repo_path(revision)
        except ValueError:
            raise p.fail(f"{where}.requested_revision",
                         f"unsafe revision {revision!r}") from None
        entries.append(
            LockEntry(
                repo_id=repo_id,
                requested_revision=revision,
                commit=p.string(m["commit"], f"{where}.commit", HEX40),
                files=tuple(files),
                license=p.opt_string(m.get("license"), f"{where}.license"),
                gated=p.boolean(m.get("gated", False), f"{where}.gated"),
                pinned_at=p.string(
                    m.get("pinned_at", "1970-01-01T00:00:00Z"), f"{where}.pinned_at", TIMESTAMP
                ),
                origin=_origin(p, m.get("origin"), f"{where}.origin"),
            )
        )
    return entries


def _origin(p: _Parser, raw: Any, where: str) -> Origin | None:
    if raw is None:
        return None
    o = p.obj(raw, where, ("kind", "path"))
    if o["kind"] != "local":
        raise p.fail(f"{where}.kind", f"unknown origin kind {o['kind']!r} (expected 'local')")
    return Origin(
        kind="local",
        path=p.string(o["path"], f"{where}.path"),
        claimed_repo_id=p.opt_string(o.get("claimed_repo_id"), f"{where}.claimed_repo_id",
                                     REPO_ID),
        claimed_commit=p.opt_string(o.get("claimed_commit"), f"{where}.claimed_commit", HEX40),
    )
