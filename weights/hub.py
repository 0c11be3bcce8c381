"""Every call into ``huggingface_hub`` lives here; nothing else in :mod:`weights` imports it.

The module is imported lazily (only by ``pin``, ``pull`` and ``size REPO_ID``), and
:func:`_hf` switches Hub telemetry off (``HF_HUB_DISABLE_TELEMETRY=1``) before the first
import of huggingface_hub, whose ``constants`` module reads the environment at import. The
endpoint is always passed explicitly, so ``HF_ENDPOINT`` is read once by the CLI, not by the
library.

huggingface_hub exceptions are mapped to :mod:`weights.errors` at this boundary.

Redirects: every request goes through the client's own HTTP client, which follows a redirect
only when :class:`weights.redirects.RedirectPolicy` allows it (never https to http, only to the
endpoint's host or the allowed redirect hosts); httpx drops ``Authorization`` when a redirect
leaves the endpoint's origin. huggingface_hub's shared session (which follows any redirect) is
never used.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from weights.errors import (
    FileNotOnHubError,
    GatedRepoError,
    HubAnswerError,
    HubError,
    HubMismatchError,
    HubOfflineError,
    RepoNotFoundError,
    RevisionNotFoundError,
    StorageError,
    UnsafeHubPathError,
    WeightsError,
)
from weights.lockvalues import HEX40, HEX64, is_commit_sha
from weights.modeltree import unsafe_path_reason
from weights.redirects import RedirectPolicy

DEFAULT_ENDPOINT = "https://huggingface.co"

_log = logging.getLogger(__name__)

ProgressCallback = Callable[[int], None]


def _hf() -> types.ModuleType:
    """Import huggingface_hub with telemetry off (set before its constants are read)."""
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    import huggingface_hub
    import huggingface_hub.errors
    import huggingface_hub.hf_api
    import huggingface_hub.utils

    return huggingface_hub


@dataclass(frozen=True)
class RemoteFile:
    """A file as the Hub describes it at one commit.

    Attributes:
        path: Repository-relative path.
        size: Size in bytes of the content.
        git_oid: Git object id (``blobId``): the content's git blob SHA-1 for regular files,
            the pointer's for LFS files.
        lfs_sha256: sha256 of the content for LFS files, None for regular files.
    """

    path: str
    size: int
    git_oid: str
    lfs_sha256: str | None

    @property
    def lfs(self) -> bool:
        """True for LFS files."""
        return self.lfs_sha256 is not None


@dataclass(frozen=True)
class RemoteSnapshot:
    """A repository resolved at one revision.

    Attributes:
        repo_id: Canonical repository id as the Hub spells it.
        commit: 40-hex commit SHA the revision resolved to.
        files: Every file of the commit, sorted by path.
        license: ``cardData.license`` of the model card (first one if a list), or None.
        gated: True if the repository is gated (``gated`` is ``"auto"``/``"manual"``).
    """

    repo_id: str
    commit: str
    files: tuple[RemoteFile, ...]
    license: str | None
    gated: bool


@contextlib.contextmanager
def _mapped(what: str, endpoint: str) -> Iterator[None]:
    """Translate huggingface_hub / HTTP errors into :mod:`weights.errors`."""
    hf = _hf()
    import httpx2

    errors = hf.errors
    try:
        yield
    except errors.HFValidationError as exc:  # a malformed id or revision, refused locally
        raise WeightsError(f"{what}: {exc}") from exc
    except errors.GatedRepoError as exc:
        raise GatedRepoError(
            f"{what}: the repository is gated and needs a token with access",
            hint="accept the licence on the Hub, then set HF_TOKEN or pass --token",
        ) from exc
    except errors.RepositoryNotFoundError as exc:
        raise RepoNotFoundError(f"{what}: repository not found on {endpoint}") from exc
    except errors.RevisionNotFoundError as exc:
        raise RevisionNotFoundError(f"{what}: revision not found") from exc
    except errors.RemoteEntryNotFoundError as exc:
        raise FileNotOnHubError(f"{what}: file not found at this revision") from exc
    except errors.LocalEntryNotFoundError as exc:
        raise HubError(
            f"{what}: cannot reach the hub at {endpoint}",
            hint="check HF_ENDPOINT / --endpoint and the network path to the hub",
        ) from exc
    except errors.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise HubError(f"{what}: hub answered HTTP {status}") from exc
    except (httpx2.TransportError, httpx2.TimeoutException) as exc:
        raise HubError(
            f"{what}: cannot reach the hub at {endpoint}: {exc}",
            hint="check HF_ENDPOINT / --endpoint and the network path to the hub",
        ) from exc
    except OSError as exc:
        raise HubError(f"{what}: {exc}") from exc


@contextlib.contextmanager
def _local(part: Path) -> Iterator[None]:
    """Report a failed local write as :class:`StorageError` (not as a hub problem)."""
    try:
        yield
    except OSError as exc:
        raise StorageError(
            f"cannot write {part}: {exc.strerror or exc}",
            hint="free space (or fix permissions) there and run the same command again: "
                 "the download resumes from the bytes already written",
        ) from exc


def _check_answer(repo_id: str, revision: str, answered_id: str, commit: str,
                  endpoint: str) -> None:
    """Refuse a model-info answer for another repository (the Hub spells ids in any case, so
    case is ignored) or another commit than a SHA asked for, or a commit that is not 40 hex.

    Raises:
        HubMismatchError: Another repository or commit.
        HubAnswerError: The commit is not a 40-hex SHA.
    """
    what = f"{repo_id}@{revision}"
    if answered_id.lower() != repo_id.lower():
        raise HubMismatchError(
            f"{what}: {endpoint} answered for repository {answered_id!r}, not {repo_id}; "
            "nothing was recorded",
            hint="if the repository was renamed, pin it by its new id; otherwise the hub (or "
                 "a proxy in front of it) is not answering what was asked")
    if not is_commit_sha(commit):
        raise HubAnswerError(f"{what}: the hub reported commit {commit!r}, not a 40-hex SHA")
    if is_commit_sha(revision.lower()) and commit != revision.lower():
        raise HubMismatchError(f"{what}: {endpoint} answered with commit {commit}, not the "
                               "commit asked for; nothing was recorded")


def _remote_file(repo_id: str, path: str, size: Any, blob_id: Any,
                 sha256: Any) -> RemoteFile:
    """A :class:`RemoteFile` from the hub's sibling values, each checked before any use (the
    path joins a local directory, the blob id names a staging file).

    Raises:
        UnsafeHubPathError: A path that could escape the model's directory.
        HubAnswerError: A size that is not a non-negative integer, a blob id that is not 40
            hex, an LFS sha256 that is not 64 hex.
    """
    reason = unsafe_path_reason(path) if isinstance(path, str) else "is not a string"
    if reason is not None:
        raise UnsafeHubPathError(
            f"{repo_id}: the hub lists a file {path!r} whose path {reason}; nothing was "
            "recorded or downloaded", path=str(path),
            hint="a file name like this cannot be installed safely: report it to the "
                 "repository's owner, or pin another revision")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise HubAnswerError(f"{repo_id}: the hub gave size {size!r} for {path!r}")
    if not isinstance(blob_id, str) or HEX40.fullmatch(blob_id) is None:
        raise HubAnswerError(f"{repo_id}: the hub gave blob id {blob_id!r} for {path!r}, not "
                             "a 40-hex git object id")
    if sha256 is not None and (not isinstance(sha256, str) or HEX64.fullmatch(sha256) is None):
        raise HubAnswerError(f"{repo_id}: the hub gave LFS sha256 {sha256!r} for {path!r}, "
                             "not 64 hex")
    return RemoteFile(path=path, size=size, git_oid=blob_id, lfs_sha256=sha256)


def _refuse_oversize(what: str, part: Path, response: Any, have: int, size: int) -> None:
    """Refuse a download that would grow past the lock's ``size`` bytes, before writing it.

    With a ``response``, its ``Content-Length`` (plus the ``have`` bytes kept, for a 206) is
    checked before any byte is read; without one, ``have`` is the byte count the next chunk
    would reach. The partial file is removed: its bytes came from a hub that does not serve
    the pinned file.

    Raises:
        HubError: The hub sends (or announces) more bytes than the lock says.
    """
    if response is not None:
        declared = response.headers.get("Content-Length")
        if declared is None or not declared.isdigit():
            return
        have = (have if response.status_code == 206 else 0) + int(declared)
    if have <= size:
        return
    part.unlink(missing_ok=True)
    raise HubError(f"{what}: hub sends at least {have} bytes, lock says {size}; download "
                   "stopped, partial file removed",
                   hint="the hub or a mirror serves other content than the pinned file")


class HubClient:
    """Talks to one hub endpoint with one token.

    Args:
        endpoint: Base URL of the hub (``HF_ENDPOINT``), e.g. ``https://huggingface.co``.
        token: Access token for gated or private repositories, or None.
        timeout_s: Timeout of metadata requests, in seconds.
        redirect_hosts: Hosts a redirect may lead to besides the endpoint's (exact names or
            ``*.domain``); ``None`` or empty: :data:`weights.redirects.DEFAULT_REDIRECT_HOSTS`.
        resolver: ``(host, port) -> [address, ...]`` for every connection (default: the
            system resolver); each address is checked before connecting
            (:mod:`weights.netcheck`).
        offline: Offline mode (``HF_HUB_OFFLINE``, read by the CLI): every method that would
            contact the hub raises :class:`HubOfflineError` before any name lookup or
            connection.

    Raises:
        WeightsError: A redirect host that is not a host name or ``*.domain``.
    """

    def __init__(self, endpoint: str = DEFAULT_ENDPOINT, token: str | None = None,
                 timeout_s: float = 30.0, redirect_hosts: Iterable[str] | None = None,
                 resolver: Callable[[str, int], list[str]] | None = None,
                 offline: bool = False) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.offline = offline
        # False: never fall back to a token stored on disk or in the environment implicitly.
        self.token: str | bool = token if token else False
        self.timeout_s = timeout_s
        self.redirects = RedirectPolicy.of(self.endpoint, redirect_hosts)
        self.resolver = resolver

    def require_online(self, what: str) -> None:
        """Raise unless the hub may be contacted.

        Raises:
            HubOfflineError: :attr:`offline` is set (``what`` names the request refused).
        """
        if self.offline:
            raise HubOfflineError(
                f"{what}: offline mode is on (HF_HUB_OFFLINE): the hub at {self.endpoint} is "
                "not contacted",
                hint="unset HF_HUB_OFFLINE (and TRANSFORMERS_OFFLINE) to reach the hub; "
                     "offline, use a local directory: weights lock/size/plan DIR")

    def _session(self, what: str) -> Any:
        """A new ``httpx2.Client`` (use it with ``with``) that follows a redirect only when
        :attr:`redirects` allows it; one per operation (a metadata request, a file), so no
        connection outlives the call that opened it. Every hub request goes through here.

        Raises:
            HubOfflineError: :attr:`offline` is set (``what`` names the request refused).
        """
        self.require_online(what)
        _hf()
        import httpx2

        policy = self.redirects

        def check_redirect(response: httpx2.Response) -> None:
            if response.has_redirect_location:
                source = response.request.url
                policy.check(str(source), str(source.join(response.headers["Location"])))

        from weights.netcheck import CheckedBackend, CheckedTransport

        # Every connection (the endpoint's and each redirect's) is checked after resolution.
        exact = [h for h in policy.hosts if not h.startswith("*.")]
        backend = CheckedBackend([urlsplit(self.endpoint).hostname or "", *exact],
                                 self.resolver)
        return httpx2.Client(follow_redirects=True, timeout=None,
                             event_hooks={"response": [check_redirect]},
                             transport=CheckedTransport(backend))

    def snapshot(self, repo_id: str, revision: str) -> RemoteSnapshot:
        """Resolve ``revision`` and describe every file at the resulting commit (one request).

        Raises:
            RepoNotFoundError, RevisionNotFoundError, GatedRepoError, HubError.
        """
        hf = _hf()
        with _mapped(f"{repo_id}@{revision}", self.endpoint), \
                self._session(f"{repo_id}@{revision}") as http:
            # HfApi.model_info(files_metadata=True), through this client's session.
            hf.utils.validate_repo_id(repo_id)
            response = http.get(
                f"{self.endpoint}/api/models/{repo_id}/revision/{quote(revision, safe='')}",
                headers=hf.utils.build_hf_headers(token=self.token), params={"blobs": True},
                timeout=self.timeout_s)
            hf.utils.hf_raise_for_status(response)
            info = hf.hf_api.ModelInfo(**response.json())
        if not info.sha or not info.id:
            raise HubError(f"{repo_id}@{revision}: hub did not report a commit")
        _check_answer(repo_id, revision, str(info.id), str(info.sha), self.endpoint)
        files: list[RemoteFile] = []
        for s in info.siblings or []:
            if s.size is None or s.blob_id is None:
                raise HubError(f"{repo_id}: hub gave no size/blob id for {s.rfilename!r}")
            lfs = s.lfs
            files.append(_remote_file(repo_id, s.rfilename, lfs["size"] if lfs else s.size,
                                      s.blob_id, lfs["sha256"] if lfs else None))
        card = info.card_data
        lic: Any = card.get("license") if card is not None else None
        if isinstance(lic, list):
            lic = lic[0] if lic else None
        return RemoteSnapshot(
            repo_id=info.id,
            commit=info.sha,
            files=tuple(sorted(files, key=lambda f: f.path)),
            license=str(lic) if lic is not None else None,
            gated=bool(info.gated),
        )

    def fetch(
        self,
        repo_id: str,
        path: str,
        commit: str,
        part: Path,
        size: int,
        progress: ProgressCallback | None = None,
        max_retries: int = 5,
    ) -> Path:
        """Download one file of ``commit`` into ``part``, resuming whatever ``part`` holds.

        Uses huggingface_hub's URL scheme, headers, HTTP session and error mapping. An existing
        ``part`` is continued with ``Range: bytes=<len>-`` (also across runs); a dropped
        connection is retried from the last byte written, up to ``max_retries`` times without
        progress. The content is NOT verified here (huggingface_hub checks only sizes either):
        the caller hashes ``part`` before moving it anywhere visible.

        Args:
            repo_id: Repository.
            path: File path in the repository.
            commit: 40-hex commit SHA (never a branch: what is pinned is what is fetched).
            part: Partial file to create or continue.
            size: Expected size in bytes (from the lock).
            progress: Byte-count callback (resumed bytes are reported once, first).
            max_retries: Consecutive failed attempts tolerated.

        Returns:
            ``part``, now ``size`` bytes long.

        Raises:
            FileNotOnHubError, GatedRepoError, RepoNotFoundError, HubError.
        """
        hf = _hf()
        import httpx2

        what = f"{repo_id}/{path}@{commit[:12]}"
        self.require_online(what)  # before the partial file is created
        url = hf.hf_hub_url(repo_id, path, revision=commit, endpoint=self.endpoint)
        with _local(part):
            part.parent.mkdir(parents=True, exist_ok=True)
            if part.exists() and part.stat().st_size > size:
                part.unlink()
            if not part.exists():
                part.touch()
            have = part.stat().st_size
        if progress is not None and have:
            progress(have)
        failures = 0
        with _mapped(what, self.endpoint), self._session(what) as http:
            while have < size:
                headers = hf.utils.build_hf_headers(token=self.token)
                headers["Accept-Encoding"] = "identity"
                if have:
                    headers["Range"] = f"bytes={have}-"
                before = have
                try:
                    with http.stream(
                        "GET", url, headers=headers, timeout=self.timeout_s,
                        follow_redirects=True,
                    ) as response:
                        hf.utils.hf_raise_for_status(response)
                        served = response.headers.get("X-Repo-Commit")
                        if served is not None and served != commit:
                            raise HubError(f"{what}: hub served commit {served}")
                        if have and response.status_code != 206:
                            # Range ignored: start over rather than append a second copy.
                            if progress is not None:
                                progress(-have)
                            have = 0
                        _refuse_oversize(what, part, response, have, size)
                        with _local(part), open(part, "r+b") as fh:
                            fh.seek(have)
                            fh.truncate()
                            for chunk in response.iter_bytes():
                                if have + len(chunk) > size:  # not one byte past the lock
                                    fh.close()
                                    _refuse_oversize(what, part, None, have + len(chunk), size)
                                fh.write(chunk)
                                have += len(chunk)
                                if progress is not None:
                                    progress(len(chunk))
                            fh.flush()
                            os.fsync(fh.fileno())
                except (httpx2.TransportError, httpx2.TimeoutException) as exc:
                    have = part.stat().st_size
                    failures = 0 if have > before else failures + 1
                    if failures > max_retries:
                        raise HubError(f"{what}: download failed at byte {have}: {exc}",
                                       hint="run the same command again to resume") from exc
                    _log.warning("%s: connection lost at byte %d (%s); resuming", what, have, exc)
                    time.sleep(0.2 * failures)
                    continue
                if have != size:
                    if have > size or have == before:
                        raise HubError(f"{what}: hub sent {have} bytes, lock says {size}")
        return part

    def read_range(self, repo_id: str, revision: str, path: str, start: int, length: int) -> bytes:
        """Read ``length`` bytes at ``start`` of a file with an HTTP Range request.

        Reading stops as soon as the bytes asked for are in: a hub that ignores the range
        (200) is read only up to ``start + length`` bytes; one that answers 206 with more than
        ``length`` bytes is refused at the first chunk past them.

        Raises:
            FileNotOnHubError, GatedRepoError, RepoNotFoundError, HubError.
        """
        hf = _hf()
        url = hf.hf_hub_url(repo_id, path, revision=revision, endpoint=self.endpoint)
        headers = hf.utils.build_hf_headers(token=self.token)
        headers["Range"] = f"bytes={start}-{start + length - 1}"
        headers["Accept-Encoding"] = "identity"
        what = f"{repo_id}/{path}@{revision}"
        buf = bytearray()
        with _mapped(what, self.endpoint), self._session(what) as http, http.stream(
                "GET", url, headers=headers, timeout=self.timeout_s) as response:
            hf.utils.hf_raise_for_status(response)
            partial = response.status_code == 206
            want = length if partial else start + length
            for chunk in response.iter_bytes():
                buf += chunk
                if len(buf) > want and partial:
                    raise HubError(f"{what}: hub sends more than the {length} bytes asked "
                                   f"(bytes {start}-{start + length - 1}); stopped reading")
                if len(buf) >= want:
                    break
        return bytes(buf if partial else buf[start : start + length])
