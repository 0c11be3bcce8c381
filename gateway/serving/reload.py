"""Live reload: SIGHUP (or a watched file change) applies a new configuration without a restart.

A reload reads the config file again (with its ``keys_file``, the policy file and the replicas'
``api_key_file``), checks it whole, and either swaps it in or refuses it whole:

1. :func:`gateway.config.loader.load` validates it (``file:line: key: problem``);
2. :func:`restart_only_changes` refuses a change to a key that cannot change in a running
   process (listen address, audit store, telemetry, connection limits, ...): only the keys of
   :data:`RELOADABLE` change live;
3. :func:`gateway.assembly.reassemble` builds the new keys, router and policy routing next to the
   running ones (the audit log, quotas, telemetry, upstream pool and egress guard are kept);
4. the app swaps its request snapshot (:class:`gateway.state.LiveState`) in one step: a request
   takes the snapshot current at its start and keeps it to its end, so requests in flight keep
   the keys, replicas and policy decision they were admitted with, and a removed replica drains.

A refused reload leaves the running configuration serving and writes one log line and, with the
audit log on, a ``config.reload_refused`` record naming every problem. An applied one writes one
log line and a ``config.reloaded`` record with the old and new revisions (:func:`revision_of`).
An override that a removed key left behind in ``quotas``/``flow_control`` does not refuse the
reload (a revocation must never be blocked by it): it is applied with a warning line and the
record's ``warnings`` (:mod:`gateway.config.override_names`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from clishell import not_regular
from gateway.assembly import Gateway, reassemble
from gateway.config.errors import KeyPath, dotted, problems_of
from gateway.config.loader import load
from gateway.config.override_names import OverrideNames
from gateway.config.settings import GatewaySettings
from gateway.errors import ConfigError
from gateway.identity.build import identity_files
from gateway.serving.periodic import Periodic

__all__ = [
    "CONFIG_RELOADED",
    "CONFIG_RELOAD_REFUSED",
    "RELOADABLE",
    "ReloadResult",
    "Reloader",
    "restart_only_changes",
    "revision_of",
]

_log = logging.getLogger(__name__)

CONFIG_RELOADED = "config.reloaded"
CONFIG_RELOAD_REFUSED = "config.reload_refused"

RELOADABLE: tuple[KeyPath, ...] = (
    ("models",),
    ("keys",),
    ("limits", "max_body_bytes"),
    ("limits", "client_body_timeout_s"),
    ("limits", "forward_headers"),
    ("timeouts", "connect_s"),
    ("timeouts", "first_byte_s"),
    ("timeouts", "idle_s"),
    ("retries",),
    ("health", "cooldown_s"),
    ("policy", "file"),
    ("quotas", "defaults"),
    ("quotas", "keys"),
    ("quotas", "teams"),
    ("quotas", "orgs"),
    ("flow_control", "keys"),
    ("flow_control", "teams"),
    ("identity",),
)
"""The keys a live reload may change (a key and everything under it). Every other key is read
once at start (server socket and its limits, upstream connection pool, audit store, key store,
quota backend, telemetry exporters, logging, drain, the prober's and scraper's schedules, the
rest of ``flow_control``) and a change to it is refused, naming it. The policy file's content
may change too, except its destinations (see :func:`gateway.assembly.reassemble`)."""


def revision_of(settings: GatewaySettings, policy: Any = None) -> str:
    """A stable hash of an effective configuration: ``sha256:<64 hex>``.

    Hashed: the validated settings as JSON (keys of the ``keys_file`` merged in, paths
    resolved, defaults filled), the SHA-256 of each replica's credential (a rotated Secret is a
    new revision; the credential itself is never hashed alone or logged), and the policy's own
    revision. The same file contents give the same revision in every process and restart.

    Args:
        settings: The validated settings.
        policy: The loaded ``policy.Policy`` (``None`` without a policy section).
    """
    secrets = [
        hashlib.sha256(r.api_key.get_secret_value().encode()).hexdigest() if r.api_key else None
        for m in settings.models for r in m.replicas
    ]
    doc = {
        "config": settings.model_dump(mode="json"),
        "replica_credentials_sha256": secrets,
        "policy": getattr(policy, "revision", None),
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _differences(old: Any, new: Any, path: KeyPath) -> Iterator[KeyPath]:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in (*old, *(k for k in new if k not in old)):
            yield from _differences(old.get(key), new.get(key), (*path, key))
    elif old != new:
        yield path


def restart_only_changes(old: GatewaySettings, new: GatewaySettings) -> list[KeyPath]:
    """The keys that differ between ``old`` and ``new`` and cannot change live.

    Returns:
        Key paths (``("listen", "port")``), empty when every difference is in
        :data:`RELOADABLE`.
    """
    return [
        path for path in _differences(old.model_dump(mode="json"), new.model_dump(mode="json"), ())
        if not any(path[: len(live)] == live for live in RELOADABLE)
    ]


@dataclass(frozen=True, slots=True)
class ReloadResult:
    """What one reload did.

    Attributes:
        applied: The new configuration is serving.
        old_revision: The revision serving before.
        new_revision: The revision of the new configuration (``None`` when it was refused
            before it could be built).
        problems: ``file:line: key: problem`` per problem of a refused reload.
        warnings: ``file:line: key: problem`` per problem an applied reload tolerated (an
            override left behind by a removed key, see :mod:`gateway.config.override_names`).
    """

    applied: bool
    old_revision: str
    new_revision: str | None = None
    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


Swap = Callable[[Gateway], None]


class Reloader:
    """Reloads the config file of a running gateway (``gateway serve``).

    Args:
        path: The config file.
        running: The gateway served at start.
        environ: Where ``api_key_env`` names are looked up.
        adjust: Applied to every newly loaded settings (the command line's overrides of
            ``listen``), so that they are compared like for like.
        on_applied: Called with the new gateway after each applied reload (``gateway serve``:
            the admin port's ``/status``).
    """

    def __init__(
        self,
        path: Path,
        running: Gateway,
        *,
        environ: Mapping[str, str] | None = None,
        adjust: Callable[[GatewaySettings], GatewaySettings] = lambda s: s,
        on_applied: Callable[[Gateway], None] | None = None,
    ) -> None:
        self.path = path
        self.running = running
        self.revision = revision_of(running.settings, running.policy)
        self._environ = dict(environ or {})
        self._adjust = adjust
        self._on_applied = on_applied
        self._lock = asyncio.Lock()
        self._swap: Swap | None = None
        self._tasks: set[asyncio.Task[ReloadResult]] = set()
        self._watch: _FileWatch | None = None

    def attach(self, swap: Swap) -> None:
        """Called by the app's lifespan once serving: ``swap(gateway)`` installs a new gateway.

        Starts the file watch when ``reload.watch`` is on.
        """
        self._swap = swap
        reload = self.running.settings.reload
        if reload.watch:
            self._watch = _FileWatch(self, reload.interval_s)
            self._watch.start()

    async def detach(self) -> None:
        """Called by the lifespan at shutdown: stop watching, let a running reload finish."""
        if self._watch is not None:
            await self._watch.stop()
        self._swap = None
        for task in list(self._tasks):
            await asyncio.wait([task], timeout=5.0)

    def trigger(self, cause: str = "signal") -> None:
        """Start a reload in the running loop (the SIGHUP handler); reloads run one at a time."""
        task = asyncio.get_running_loop().create_task(self.reload(cause))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def reload(self, cause: str = "signal") -> ReloadResult:
        """Load, check and apply the config file, or refuse it whole.

        Args:
            cause: Why (``signal``, ``watch``, ...): logged and audited.

        Returns:
            What was done. Never raises for a bad configuration (it is refused).
        """
        async with self._lock:
            t0 = time.perf_counter()
            if self._swap is None:
                _log.warning("reload (%s) ignored: the gateway is not serving", cause)
                return ReloadResult(False, self.revision, problems=("not serving",))
            if self._watch is not None:
                self._watch.seen = await asyncio.to_thread(self._watch.digest)
            built = await asyncio.to_thread(self._build)
            if isinstance(built, list):
                return await self._refuse(cause, built)
            gateway, new_revision, warnings = built
            old_revision = self.revision
            if new_revision == old_revision:
                _log.info("reload (%s): no change (revision %s)", cause, old_revision)
                return ReloadResult(False, old_revision, new_revision)
            self._swap(gateway)
            self.running, self.revision = gateway, new_revision
            if self._on_applied is not None:
                self._on_applied(gateway)
            record: dict[str, Any] = {
                "type": CONFIG_RELOADED, "cause": cause, "file": str(self.path),
                "old_revision": old_revision, "new_revision": new_revision}
            if warnings:
                record["warnings"] = list(warnings)
                _log.warning("reload of %s (%s) applied with %d warning(s): %s", self.path,
                             cause, len(warnings), " | ".join(warnings))
            await self._audit(record)
            _log.info("reloaded %s (%s): revision %s -> %s in %.1f ms", self.path, cause,
                      old_revision, new_revision, (time.perf_counter() - t0) * 1000.0)
            return ReloadResult(True, old_revision, new_revision, warnings=warnings)

    def _build(self) -> tuple[Gateway, str, tuple[str, ...]] | list[str]:
        """The new gateway, its revision and the warnings of its file, or the problems (run in
        a thread: file reads).

        An override left behind by a key this reload removes is tolerated with a warning
        (:mod:`gateway.config.override_names`): it must not block a revocation.
        """
        file = str(self.path)
        piped = [f"{f}: not a regular file (a pipe or FIFO is read once, at start): a live "
                 "reload reads its files again; restart the gateway to apply a change"
                 for f in self.files() if not_regular(f)]
        if piped:  # reading it again would wait for a writer for ever, holding every reload
            return piped
        try:
            loaded = load(self.path, self._environ,
                          tolerate=OverrideNames.known_to(self.running.settings))
        except ConfigError as exc:
            return [str(p) for p in problems_of(exc, file=file)]
        warnings = tuple(str(w) for w in loaded.warnings)
        settings = self._adjust(loaded)
        fixed = restart_only_changes(self.running.settings, settings)
        if fixed:
            fixed_error = ConfigError("\n".join(
                f"{dotted(path)}: cannot change while serving; restart the gateway to apply it "
                "(the running configuration stays)" for path in fixed
            ))
            return [str(p) for p in settings.problems_of(fixed_error)]
        try:
            gateway = reassemble(self.running, settings, self.path.parent)
        except ConfigError as exc:
            return [str(p) for p in settings.problems_of(exc)]
        return gateway, revision_of(settings, gateway.policy), warnings

    def files(self) -> list[Path]:
        """The files a reload reads: the config file, its ``keys_file``, the policy file and
        the replicas' ``api_key_file`` (those of the running configuration, and the
        ``keys_file`` the config file names now; the config file itself is read only when it
        is a regular file)."""
        path = self.path
        settings = self.running.settings
        out = [path]
        raw = None
        if not not_regular(path):
            try:
                raw = yaml.safe_load(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, yaml.YAMLError):
                raw = None
        keys_file = raw.get("keys_file") if isinstance(raw, dict) else None
        if isinstance(keys_file, str) and keys_file:
            out.append(path.parent / keys_file)  # an absolute keys_file replaces the parent
        if settings.policy is not None:
            out.append(settings.policy.file)
        out.extend(r.api_key_file for m in settings.models for r in m.replicas
                   if r.api_key_file is not None)
        out.extend(identity_files(settings))  # JWKS files and the mTLS trust bundle
        return out

    async def _refuse(self, cause: str, problems: list[str]) -> ReloadResult:
        await self._audit({"type": CONFIG_RELOAD_REFUSED, "cause": cause, "file": str(self.path),
                           "revision": self.revision, "problems": problems})
        _log.error("reload of %s (%s) refused, still serving revision %s: %s", self.path, cause,
                   self.revision, " | ".join(problems))
        return ReloadResult(False, self.revision, problems=tuple(problems))

    async def _audit(self, event: Mapping[str, Any]) -> None:
        audit = self.running.audit
        if audit is None:
            return
        try:
            await audit.record_event(event)
        except Exception:
            _log.exception("could not record %s in the audit log", event["type"])


class _FileWatch(Periodic):
    """Polls the content of the files a configuration is read from; reloads when it changes.

    Content hashes, not modification times: Kubernetes updates a mounted ConfigMap or Secret by
    swapping a symlink, which keeps the path and may keep the time.
    """

    def __init__(self, reloader: Reloader, interval_s: float) -> None:
        self._reloader = reloader
        self.interval_s = interval_s
        self.round_name = "config file watch"
        # Not the digest now: the files may have changed since they were loaded (start-up can
        # take seconds), so the first round reloads and compares revisions.
        self.seen = ""

    def digest(self) -> str:
        """SHA-256 over every watched file's path and content (or read error); a file that is
        not a regular file is not read (a pipe's content is its writer's, once)."""
        h = hashlib.sha256()
        for file in self._reloader.files():
            h.update(str(file).encode() + b"\0")
            try:
                h.update(b"not regular" if not_regular(file) else file.read_bytes())
            except OSError as exc:
                h.update(f"unreadable: {exc.strerror}".encode())
            h.update(b"\0")
        return h.hexdigest()

    async def run_once(self) -> None:
        """Reload when a watched file's content changed since the last reload or poll."""
        now = await asyncio.to_thread(self.digest)
        if now != self.seen:
            self.seen = now
            await self._reloader.reload("watch")

