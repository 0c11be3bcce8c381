"""The one exception tree of the ``policy`` package.

Every error carries a stable machine ``code`` (snake_case) that callers map to their own
responses (the gateway turns them into OpenAI-style error JSON; the CLI into exit codes)::

    PolicyError                      code
    ├── PolicyFileError              invalid_policy        (file, line, key, problems)
    │                                policy_unreadable     (I/O error reading the file)
    ├── UnknownDataClass             unknown_data_class
    ├── UnknownDestination           unknown_destination
    ├── ClassChangeForbidden         class_change_forbidden
    ├── EgressDenied                 egress_denied         (host, port, reason)
    │   ├── EgressBlocked            egress_denied         (raised by the process guard)
    │   └── RedirectRefused          redirect_refused
    ├── GuardSelfTestFailed          guard_self_test_failed
    ├── BindingError                 destination_mismatch  (runtime.py)
    ├── RenderError                  render_refused
    ├── PiiRefused                   pii_refused           (entities; pii section)
    └── PiiScanFailed                pii_scan_failed       (detector error or timeout)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .problems import PolicyProblem


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

    The message holds one ``file:line: key: problem`` line per problem (:attr:`problems`);
    ``file``, ``line`` and ``key`` are those of the first.

    Attributes:
        file: path of the policy document (or ``<string>``).
        line: 1-based line of the offending key, when known.
        key: dotted path of the offending key (``rules[2].require.jurisdiction``), when known.
        problems: every problem found (at least one).
    """

    code = "invalid_policy"

    def __init__(
        self, message: str, *, file: str | Path = "<string>", line: int | None = None,
        key: str | None = None,
    ) -> None:
        self.file = str(file)
        self.line = line
        self.key = key
        self.problems: tuple[PolicyProblem, ...] = (PolicyProblem(key, message, self.file, line),)
        super().__init__(str(self.problems[0]))

    @classmethod
    def of(cls, problems: Sequence[PolicyProblem]) -> PolicyFileError:
        """The error of several problems of one file (one message line each).

        Raises:
            ValueError: ``problems`` is empty.
        """
        if not problems:
            raise ValueError("PolicyFileError.of needs at least one problem")
        first = problems[0]
        err = cls(first.problem, file=first.file, line=first.line, key=first.key)
        err.problems = tuple(problems)
        err.args = ("\n".join(str(p) for p in problems),)
        return err


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


class PiiRefused(PolicyError):
    """A request holds an entity type the ``pii`` section refuses (the value is never named).

    Attributes:
        entities: the refused entity types, sorted.
        verdict: the inspection's :class:`policy.pii.PiiVerdict` (for the audit record).
        in_key: refused because a finding to mask is in an object key (an argument's name),
            which cannot be masked.
        unmaskable: refused because a finding to mask cannot be masked where it is (a key, a
            number, an encoded payload, a structural string such as a function name).
    """

    code = "pii_refused"

    def __init__(self, entities: Sequence[str], verdict: object | None = None, *,
                 in_key: bool = False, unmaskable: bool = False) -> None:
        self.entities = tuple(sorted(set(entities)))
        self.verdict = verdict
        self.in_key = in_key
        self.unmaskable = unmaskable or in_key
        if in_key:
            super().__init__(
                "An argument name (an object key) holds sensitive data, and a name cannot be "
                "masked: " + ", ".join(self.entities) + ".")
            return
        if unmaskable:
            super().__init__(
                "The request holds sensitive data where it cannot be masked (an object key, a "
                "number, an encoded data: URL, or a structural field such as a function name "
                "or a schema's enum): " + ", ".join(self.entities) + ".")
            return
        super().__init__(
            "The request contains sensitive data the policy does not allow to be sent: "
            + ", ".join(self.entities) + "."
        )


class PiiScanFailed(PolicyError):
    """The detector failed or timed out on a request of a class the policy fails closed for."""

    code = "pii_scan_failed"
