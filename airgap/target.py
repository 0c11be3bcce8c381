"""What a model's install directory already holds, compared with what a bundle puts there.

``unpack`` publishes each model as one directory renamed into place (``dir`` layout:
``STORE/org/name``; ``hf-cache``: the snapshot ``snapshots/<commit>``), so a loader sees all of
it or none of it. A directory already at that name is kept only when it holds exactly the
bundle's files. Anything else in it is what a loader would take for part of the model: a
``modeling_*.py`` it imports under ``trust_remote_code``, a ``pytorch_model.bin`` it unpickles,
a stray ``model-00002-of-00002.safetensors`` shard it loads. Such an entry is *foreign* (a name
the bundle does not carry) or *differing* (a name it carries, with other content or as another
kind of file: a symlink where the bundle has a file); the install is refused naming them
(``store_conflict``), or, when the operator asks for it, the directory is replaced whole.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from airgap.errors import Code, StoreError
from clishell.text import shown
from weights import existing_twin

__all__ = ["MAX_LISTED", "Survey", "Want", "admit", "check_dirs", "refusal", "refuse_twin",
           "survey"]

#: Entries named in a refusal; the rest are counted.
MAX_LISTED = 20


@dataclass(frozen=True)
class Want:
    """What the bundle installs at one path of the directory.

    Attributes:
        sha256: hex digest of the content.
        size: size in bytes.
        link: the symlink target the install writes (``hf-cache`` snapshots), or None for a
            regular file (``dir`` layout). A snapshot may also hold the content as a regular
            file (as ``huggingface_hub`` writes where symlinks are unavailable).
    """

    sha256: str
    size: int
    link: str | None = None


@dataclass
class Survey:
    """An existing install directory, entry by entry, against what the bundle puts there.

    Attributes:
        root: the directory.
        wanted: how many files the bundle installs there.
        exists: whether ``root`` exists (as a real directory; a symlink there is refused
            before this, ``store_unsafe``).
        matching: bundle paths that already hold the bundle's content.
        foreign: entries the bundle does not carry, relative to ``root`` (a directory ends
            with ``/``; its content is not listed).
        differing: bundle paths (or directories the bundle needs) holding something else.
    """

    root: Path
    wanted: int
    exists: bool
    matching: int = 0
    foreign: list[str] = field(default_factory=list)
    differing: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """Nothing in the directory but the bundle's own content (some of it, maybe)."""
        return not self.foreign and not self.differing

    @property
    def complete(self) -> bool:
        """The directory holds exactly the bundle's files: nothing to install there."""
        return self.exists and self.clean and self.matching == self.wanted


def survey(root: Path, wanted: Mapping[str, Want], digest: Callable[[Path], str]) -> Survey:
    """Compare the directory ``root`` with the files the bundle installs there.

    Symlinks are never followed; a file is hashed (``digest``) only when its size matches.

    Args:
        root: the model directory or snapshot (need not exist).
        wanted: ``/``-separated relative path -> what the bundle installs there.
        digest: returns the hex sha256 of a regular file.

    Returns:
        the :class:`Survey`.

    Raises:
        StoreError: ``store_unsafe`` if ``root`` is not a directory; ``io_error``-like
            failures come from ``digest``.
    """
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return Survey(root, len(wanted), exists=False)
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise StoreError(Code.STORE_UNSAFE, f"{root} is {kind}; refusing to write through it")
    dirs = {p.rsplit("/", i)[0] for p in wanted for i in range(1, p.count("/") + 1)}
    found = Survey(root, len(wanted), exists=True)
    _walk(root, "", wanted, dirs, digest, found)
    found.foreign.sort()
    found.differing.sort()
    return found


def _walk(directory: Path, prefix: str, wanted: Mapping[str, Want], dirs: set[str],
          digest: Callable[[Path], str], found: Survey) -> None:
    with os.scandir(directory) as entries:
        listing = sorted(entries, key=lambda e: e.name)
    for entry in listing:
        rel = prefix + entry.name
        st = entry.stat(follow_symlinks=False)
        if rel in dirs:
            if stat.S_ISDIR(st.st_mode):
                _walk(Path(entry.path), rel + "/", wanted, dirs, digest, found)
            else:
                found.differing.append(rel)
            continue
        want = wanted.get(rel)
        if want is None:
            found.foreign.append(rel + "/" if stat.S_ISDIR(st.st_mode) else rel)
        elif _holds(Path(entry.path), st, want, digest):
            found.matching += 1
        else:
            found.differing.append(rel)


def _holds(path: Path, st: os.stat_result, want: Want, digest: Callable[[Path], str]) -> bool:
    if stat.S_ISLNK(st.st_mode):
        return want.link is not None and os.readlink(path) == want.link
    return stat.S_ISREG(st.st_mode) and st.st_size == want.size and digest(path) == want.sha256


def admit(found: Survey, replace: bool, what: str) -> list[str]:
    """Allow replacing the directory ``found`` describes, or refuse it.

    One holding only some of the bundle's files (as they are in the bundle) is replaced
    without asking: nothing in it is lost.

    Args:
        found: the survey of an incomplete directory.
        replace: the operator asked to replace a directory holding anything else.
        what: what the directory is, for the message (``the directory of model acme/tiny``).

    Returns:
        the entries the replacement removes (foreign, then differing; empty if clean).

    Raises:
        StoreError: ``store_conflict`` (:func:`refusal`) if it holds anything else and
            ``replace`` is False.
    """
    if not found.clean and not replace:
        raise refusal(found, what)
    return found.foreign + found.differing


def refuse_twin(store: Path, relative: str, repo_id: str) -> None:
    """Refuse a model whose folder the store already holds under another spelling.

    ``ORG/Tiny`` next to ``org/tiny`` is one repository on the Hub and one folder on a
    case-folding disk (:mod:`weights.installpaths`).

    Args:
        store: the store root.
        relative: the model's folder in it (``org/name``, or ``models--org--name``).
        repo_id: the model, for the message.

    Raises:
        StoreError: ``store_conflict`` naming both folders.
    """
    twin = existing_twin(store, relative)
    if twin is not None:
        raise StoreError(Code.STORE_CONFLICT, f"{repo_id} would install to {store / relative}, "
                         f"but the store holds {twin}, the same name when case and Unicode "
                         "normalisation are ignored; unpack with the repo id spelled as "
                         "installed, or remove the other copy")  # fmt: skip


def check_dirs(root: Path, directory: Path) -> None:
    """Every existing component from ``root`` down to ``directory`` must be a real directory.

    Raises:
        StoreError: ``store_unsafe`` naming the first symlink or non-directory.
    """
    rel = directory.relative_to(root)
    cur = root
    for comp in rel.parts:
        cur = cur / comp
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
            raise StoreError(Code.STORE_UNSAFE, f"{cur} is {kind}; refusing to write through it")


def refusal(found: Survey, what: str) -> StoreError:
    """The ``store_conflict`` error for a directory that holds more or other than the bundle.

    Args:
        found: a survey that is not :attr:`Survey.clean`.
        what: what the directory is, for the message (``model acme/tiny directory``).

    Returns:
        the error (every entry in ``paths``; the message names the first ``MAX_LISTED``).
    """
    says = []
    for label, names in (("files the bundle does not carry", found.foreign),
                         ("other content at the bundle's paths", found.differing)):
        if names:
            listed = ", ".join(shown(n) for n in names[:MAX_LISTED])
            more = len(names) - MAX_LISTED
            says.append(f"{label}: {listed}" + (f" and {more} more" if more > 0 else ""))
    return StoreError(
        Code.STORE_CONFLICT,
        f"{shown(found.root)} ({what}) already holds {'; '.join(says)}; a loader would take "
        "them for part of the model",
        hint="remove them, unpack into another store, or rerun with --replace to replace "
             "the directory whole with the bundle's files",
        paths=tuple(found.foreign + found.differing))
