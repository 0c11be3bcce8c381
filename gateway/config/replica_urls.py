"""A replica's URL taken from the egress policy destination it names.

The replica's address has one home, the policy: a replica given as ``{destination: vllm-eu-1}``
without a ``url`` is served at that destination's ``url`` (``http://10.0.0.11:8000`` in the
policy's ``destinations:``). Changing where a replica is then means editing the policy file
only; the config says which destination serves which model. A replica that still gives its
``url`` works as before: the URL must lie inside the destination it names
(:func:`gateway.egress.binding_problems`).

Only a destination given as an ``http://`` or ``https://`` ``url`` (the server root, not a
``.../v1`` API base) can supply a replica's URL; a ``host``/``cidr`` destination says where the
process may connect, not which one server to use, so such a replica must give its ``url``.
:func:`fill_replica_urls` runs on the raw config mapping before validation (called by
:func:`gateway.config.loader.parse`), so every later reader sees an ordinary ``url``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.config.errors import KeyPath

if TYPE_CHECKING:
    from policy import Policy

__all__ = ["fill_replica_urls"]


def _missing_url(data: dict[str, Any]) -> list[tuple[KeyPath, dict[str, Any]]]:
    out: list[tuple[KeyPath, dict[str, Any]]] = []
    for i, model in enumerate(data.get("models") or ()):
        if not isinstance(model, dict):
            continue
        for j, replica in enumerate(model.get("replicas") or ()):
            if isinstance(replica, dict) and "url" not in replica:
                out.append((("models", i, "replicas", j), replica))
    return out


def _policy_file(data: dict[str, Any], base: Path) -> Path | None:
    section = data.get("policy")
    file = section.get("file") if isinstance(section, dict) else None
    if not isinstance(file, str | Path):
        return None
    path = Path(file)
    return path if path.is_absolute() else base / path


def _url_of(policy: Policy, destination: str) -> str:
    """The replica URL destination ``destination`` supplies (:func:`policy.replica_url`).

    Raises:
        ValueError: No such destination, or it is not one ``http(s)://`` server root.
    """
    from policy import BindingError, PolicyError, replica_url

    try:
        return replica_url(policy, destination)
    except BindingError as exc:
        raise ValueError(exc.message) from None
    except PolicyError as exc:
        known = ", ".join(policy.destinations) or "none"
        raise ValueError(f"{exc.message} (known: {known})") from None


def fill_replica_urls(data: dict[str, Any], base: Path) -> list[tuple[KeyPath, str]]:
    """Give each replica without ``url`` the ``url`` of the policy destination it names.

    Reads the policy file (``policy.file``, relative to ``base``) only when some replica names a
    ``destination`` and no ``url``. Replicas with a ``url`` are left as they are.

    Args:
        data: The raw config mapping (a private copy: changed in place).
        base: Directory a relative ``policy.file`` is resolved against (the config file's).

    Returns:
        ``(key path, problem)`` per replica without ``url`` whose URL could not be taken from
        the policy (no ``destination``, no ``policy:`` section, unreadable policy, unknown
        destination, a destination that is not one server's ``http(s)://`` url); the key path
        ends in ``url`` or ``destination``.
    """
    problems: list[tuple[KeyPath, str]] = []
    missing = []
    for where, replica in _missing_url(data):
        if replica.get("destination"):
            missing.append((where, replica))
        else:
            problems.append(((*where, "url"), "required: the server root (http://HOST:PORT), or "
                             "name a policy destination (destination: ID) whose url it is"))
    if not missing:
        return problems
    # Imported here: a config without such a replica never pays for the policy package.
    from policy import Policy, PolicyError

    file = _policy_file(data, base)
    if file is None:
        return [*problems, *(((*where, "url"), "required: without a policy: section, "
                              "destination cannot supply it") for where, _ in missing)]
    try:
        policy = Policy.from_file(file)
    except PolicyError as exc:
        first = exc.message.splitlines()[0] if exc.message else exc.code
        return [*problems, *(((*where, "url"), "not given, and policy.file cannot be loaded to "
                              f"supply it: {first}") for where, _ in missing)]
    for where, replica in missing:
        try:
            replica["url"] = _url_of(policy, str(replica["destination"]))
        except ValueError as exc:
            problems.append(((*where, "destination"), str(exc)))
    return problems
