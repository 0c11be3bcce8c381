"""ASGI app speaking the subset of the Hugging Face Hub HTTP API that huggingface_hub uses.

Endpoints (checked against huggingface_hub 2.4 ``hf_api.py``, ``file_download.py`` and
``utils/_http.py``):

* ``GET /api/models/{repo_id}[/revision/{rev}]`` -> model info (``id``, ``sha``, ``gated``,
  ``cardData``, ``siblings``; with ``?blobs=true`` each sibling has ``size``, ``blobId`` and
  ``lfs: {size, sha256, pointerSize}``).
* ``GET /api/models/{repo_id}/tree/{rev}[/{path}]?recursive=`` -> list of
  ``{type, oid, size, path, lfs: {oid, size, pointerSize}}``.
* ``HEAD|GET /{repo_id}/resolve/{rev}/{path}`` -> the file (a GET of an LFS file is redirected
  to ``hub.redirect_to`` when that is set, as the Hub redirects to its CDN), with ``ETag``
  (git SHA-1, or sha256 for LFS), ``X-Linked-Etag``/``X-Linked-Size`` for LFS files,
  ``X-Repo-Commit``, ``Content-Length``, ``Accept-Ranges``; ``Range: bytes=a-b`` gives 206 with
  ``Content-Range``.
* Errors carry ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``,
  ``GatedRepo``) and ``X-Error-Message``, which huggingface_hub maps to its exceptions.

The revision is percent-encoded by the client (``refs%2Fpr%2F1``), so routing uses the raw
path, as the Hub does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs, unquote

from tests.asgi_lifespan import run_lifespan
from tests.hub_emulator.model import Commit, Hub, Repo, RequestRecord

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

CHUNK_BYTES = 256 * 1024
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


class ConnectionCut(Exception):
    """Raised mid-body to make uvicorn drop the connection (fault injection)."""


def _iso(commit: Commit) -> str:
    return commit.date.strftime("%Y-%m-%dT%H:%M:%S.000Z")


class HubApp:
    """ASGI callable serving a :class:`Hub`."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await run_lifespan(receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        auth = headers.get("authorization", "")
        token = auth[7:] if auth.lower().startswith("bearer ") else None
        authorized = token is not None and token in self.hub.tokens
        method = scope["method"]
        self.hub.record(RequestRecord(method, scope["path"], headers.get("range"), authorized))
        raw = scope.get("raw_path") or scope["path"].encode()
        segs = raw.decode("latin-1").split("/")[1:]
        query = parse_qs(scope.get("query_string", b"").decode())
        if segs[:2] == ["api", "models"] and method == "GET":
            await self._api(segs[2:], query, send)
        elif "resolve" in segs[1:3] and method in ("GET", "HEAD"):
            i = segs.index("resolve", 1)
            repo_id = unquote("/".join(segs[:i]))
            if len(segs) < i + 3:
                await _error(send, 404, "EntryNotFound", "Entry not found")
                return
            rev = unquote(segs[i + 1])
            path = unquote("/".join(segs[i + 2 :]))
            if "cdn" not in query:
                redirect = self._cdn_redirect(method, repo_id, rev, path, raw)
                if redirect is not None:
                    await _redirect(send, redirect)
                    return
            await self._resolve(method, repo_id, rev, path, headers, authorized, send)
        else:
            await _error(send, 404, None, "Not found")

    def _cdn_redirect(self, method: str, repo_id: str, rev: str, path: str,
                      raw: bytes) -> str | None:
        """Where a GET of an LFS file goes when ``hub.redirect_to`` is set, else ``None``."""
        base = self.hub.redirect_to
        if base is None or method != "GET":
            return None
        _, commit, _ = self._lookup(repo_id, rev)
        entry = commit.files.get(path) if commit is not None else None
        if entry is None or not entry.lfs:
            return None
        return f"{base.rstrip('/')}{raw.decode('latin-1')}?cdn=1"

    def _lookup(self, repo_id: str, rev: str) -> tuple[Repo | None, Commit | None, str | None]:
        repo = self.hub.find(repo_id)
        if repo is None:
            return None, None, "RepoNotFound"
        commit = repo.resolve(rev)
        if commit is None:
            return repo, None, "RevisionNotFound"
        return repo, commit, None

    async def _api(self, segs: list[str], query: dict[str, list[str]], send: Send) -> None:
        # segs: org, name, [revision|tree, rev, path...] or name, [...]
        k = 2 if len(segs) >= 2 and (len(segs) == 2 or segs[2] in ("revision", "tree")) else 1
        repo_id = unquote("/".join(segs[:k]))
        rest = segs[k:]
        kind = rest[0] if rest else "revision"
        rev = unquote(rest[1]) if len(rest) > 1 else "main"
        repo, commit, err = self._lookup(repo_id, rev)
        if err == "RepoNotFound":
            await _error(send, 404, err, "Repository not found")
            return
        if commit is None or repo is None:
            await _error(send, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return
        if kind == "tree":
            sub = unquote("/".join(rest[2:])).strip("/")
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            await _json(send, 200, _tree(commit, sub, recursive))
            return
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for path, entry in sorted(commit.files.items()):
            sib: dict[str, Any] = {"rfilename": path}
            if blobs:
                sib["size"] = entry.blob.size
                sib["blobId"] = entry.oid
                if entry.lfs:
                    sib["lfs"] = {
                        "size": entry.blob.size,
                        "sha256": entry.blob.sha256,
                        "pointerSize": len(entry.pointer),
                    }
            siblings.append(sib)
        org = repo.repo_id.split("/")[0] if "/" in repo.repo_id else None
        info = {
            "_id": commit.sha[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": org,
            "sha": commit.sha,
            "lastModified": _iso(commit),
            "createdAt": _iso(repo.commits[next(iter(repo.commits))]),
            "private": False,
            "disabled": False,
            "gated": repo.gated,
            "tags": [],
            "downloads": 0,
            "likes": 0,
            "cardData": commit.card_data(),
            "siblings": siblings,
            "usedStorage": sum(e.blob.size for e in commit.files.values()),
        }
        if self.hub.rewrite_info is not None:
            info = self.hub.rewrite_info(info)
        await _json(send, 200, info)

    async def _resolve(
        self,
        method: str,
        repo_id: str,
        rev: str,
        path: str,
        headers: dict[str, str],
        authorized: bool,
        send: Send,
    ) -> None:
        head = method == "HEAD"
        repo, commit, err = self._lookup(repo_id, rev)
        if err == "RepoNotFound" or repo is None:
            await _error(send, 404, "RepoNotFound", "Repository not found", head=head)
            return
        if repo.gated and not authorized:
            await _error(
                send,
                401,
                "GatedRepo",
                f"Access to model {repo.repo_id} is restricted. You must have access to it and "
                "be authenticated to access it. Please log in.",
                head=head,
            )
            return
        if commit is None:
            await _error(send, 404, "RevisionNotFound", "Invalid rev id", head=head)
            return
        entry = commit.files.get(path)
        if entry is None:
            msg = f"{path} does not exist on \"{rev}\""
            await _error(send, 404, "EntryNotFound", msg, head=head)
            return
        data = entry.blob.data
        size = len(data)
        start, end = 0, size - 1
        status = 200
        rng = headers.get("range")
        if rng is not None and method == "GET":
            m = _RANGE.fullmatch(rng.strip())
            if m is None or (not m.group(1) and not m.group(2)):
                await _error(send, 416, None, "Invalid range", {"content-range": f"bytes */{size}"})
                return
            if m.group(1):
                start = int(m.group(1))
                end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            else:
                start, end = max(size - int(m.group(2)), 0), size - 1
            if start >= size or start > end:
                await _error(send, 416, None, "Range not satisfiable",
                             {"content-range": f"bytes */{size}"})
                return
            status = 206
        faults = self.hub.take_faults(path) if method == "GET" and size else []
        pad = sum(f.extra_bytes for f in faults if f.kind == "pad")
        declared = all(f.declare_length for f in faults if f.kind == "pad")
        out: list[tuple[bytes, bytes]] = [
            (b"content-type", b"application/octet-stream"),
            (b"accept-ranges", b"bytes"),
            (b"etag", f'"{entry.etag}"'.encode()),
            (b"x-repo-commit", commit.sha.encode()),
        ]
        if declared:
            out.append((b"content-length", str((end - start + 1 if size else 0) + pad).encode()))
        if entry.lfs:
            out += [
                (b"x-linked-etag", f'"{entry.blob.sha256}"'.encode()),
                (b"x-linked-size", str(size).encode()),
            ]
        if status == 206:
            out.append((b"content-range", f"bytes {start}-{end}/{size}".encode()))
        await send({"type": "http.response.start", "status": status, "headers": out})
        if method == "HEAD" or size == 0:
            await send({"type": "http.response.body", "body": b""})
            return
        body = data[start : end + 1] + b"X" * pad
        cut_at: int | None = None
        for fault in faults:
            if fault.kind == "corrupt" and start <= fault.offset <= end:
                i = fault.offset - start
                body = body[:i] + bytes([body[i] ^ 0xFF]) + body[i + 1 :]
            elif fault.kind == "cut":
                cut_at = fault.after_bytes
        sent = 0
        while sent < len(body):
            limit = len(body) if cut_at is None else min(len(body), cut_at)
            chunk = body[sent : min(sent + CHUNK_BYTES, limit)]
            if not chunk:
                raise ConnectionCut(f"fault: connection cut after {sent} bytes of {path}")
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            sent += len(chunk)
        await send({"type": "http.response.body", "body": b""})


def _tree(commit: Commit, sub: str, recursive: bool) -> list[dict[str, Any]]:
    prefix = f"{sub}/" if sub else ""
    files: list[dict[str, Any]] = []
    dirs: set[str] = set()
    for path, entry in sorted(commit.files.items()):
        if not path.startswith(prefix):
            continue
        rel = path[len(prefix) :]
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            if recursive or depth == 1:
                dirs.add(prefix + "/".join(parts[:depth]))
        if len(parts) > 1 and not recursive:
            continue
        item: dict[str, Any] = {"type": "file", "oid": entry.oid, "size": entry.blob.size,
                                "path": path}
        if entry.lfs:
            item["lfs"] = {"oid": entry.blob.sha256, "size": entry.blob.size,
                           "pointerSize": len(entry.pointer)}
        files.append(item)
    folders = [
        {"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in sorted(dirs)
    ]
    return folders + files


async def _redirect(send: Send, location: str) -> None:
    await send({"type": "http.response.start", "status": 302,
                "headers": [(b"location", location.encode()), (b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})


async def _json(send: Send, status: int, doc: Any) -> None:
    body = json.dumps(doc).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())],
    })
    await send({"type": "http.response.body", "body": body})


async def _error(
    send: Send,
    status: int,
    code: str | None,
    message: str,
    extra: dict[str, str] | None = None,
    *,
    head: bool = False,
) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()),
               (b"x-error-message", message.encode("ascii", "replace"))]
    if code is not None:
        headers.append((b"x-error-code", code.encode()))
    for k, v in (extra or {}).items():
        headers.append((k.encode(), v.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else body})


def create_hub_app(hub: Hub) -> HubApp:
    """Return the ASGI app serving ``hub``."""
    return HubApp(hub)
