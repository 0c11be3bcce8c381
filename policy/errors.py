"""The one exception tree of the ``policy`` package.

Every error carries a stable machine ``code`` (snake_case) that callers map to their own
responses (the gateway turns them into OpenAI-style error JSON; the CLI into exit codes)::

    PolicyError                      code
    ├── PolicyFileError              invalid_policy        (file, line, key)
    │                                policy_unreadable     (I/O error reading the file)
    ├── UnknownDataClass             unknown_data_class
    ├── UnknownDestination           unknown_destination
    ├── ClassChangeForbidden         class_change_forbidden
    ├── EgressDenied                 egress_denied         (host, port, reason)
    │   ├── EgressBlocked            egress_denied         (raised by the process guard)
    │   └── RedirectRefused          redirect_refused
    ├── GuardSelfTestFailed          guard_self_test_failed
    ├── BindingError                 destination_mismatch  (runtime.py)
    └── RenderError                  render_refused
"""

from __future__ import annotations

from pathlib import Path


class PolicyError(Exception):
    """Base class of every error raised by the policy package.

    Attributes:
        code: stable machine-readable code (never changes between releases).
    """

    code: str = "policy_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        """The human-readable message."""
        return str(self.args[0]) if self.args else self.code


class PolicyFileError(PolicyError):
    """The policy document is unreadable or invalid.

    Attributes:
        file: path of the policy document (or ``<string>``).
        line: 1-based line of the offending key, when known.
        key: dotted path of the offending key (``rules[2].require.jurisdiction``), when known.
    """

    code = "invalid_policy"

    def __init__(
        self, message: str, *, file: str | Path = "<string>", line: int | None = None,
        key: str | None = None,
    ) -> None:
        self.file = str(file)
        self.line = line
        self.key = key
        where = self.file if line is None else f"{self.file}:{line}"
        prefix = f"{where}: {key}: " if key else f"{where}: "
        super().__init__(prefix + message)


class UnknownDataClass(PolicyError):
    """A data class name that the policy does not define."""

    code = "unknown_data_class"


class UnknownDestination(PolicyError):
    """A destination id that the policy does not define."""

    code = "unknown_destination"


class ClassChangeForbidden(PolicyError):
    """A request asked to lower or raise its data class without a grant."""

    code = "class_change_forbidden"


class EgressDenied(PolicyError):
    """An outbound connection (or name lookup) that no destination allows.

    Deliberately not an :class:`OSError`: libraries retry or wrap connection errors (aiohttp
    turns an ``OSError`` into ``ClientOSError``), while a policy refusal must reach the caller
    as itself, at once.

    Attributes:
        host: host as requested (hostname or address literal).
        port: TCP port, or ``None`` when unknown.
        reason: short explanation (which check refused it).
    """

    code = "egress_denied"

    def __init__(self, host: str, port: int | None, reason: str) -> None:
        self.host = host
        self.port = port
        self.reason = reason
        target = host if port is None else f"{host}:{port}"
        super().__init__(f"egress to {target} denied by policy: {reason}")


class EgressBlocked(EgressDenied, PermissionError):
    """Raised by the process guard's audit hook inside ``socket.connect``/``getaddrinfo``.

    Also a :class:`PermissionError` (an :class:`OSError`) because the standard library and
    third-party clients only clean up a half-made socket on ``OSError``; they see a failed
    connection. The policy transport unwraps it from aiohttp's errors.
    """


class RedirectRefused(EgressDenied):
    """An upstream answered with a redirect; policy-checked clients never follow one."""

    code = "redirect_refused"


class GuardSelfTestFailed(PolicyError):
    """The process egress guard did not block a connection to a denied address."""

    code = "guard_self_test_failed"


class RenderError(PolicyError):
    """A destination cannot be rendered safely (e.g. it would allow ``0.0.0.0/0``)."""

    code = "render_refused"
