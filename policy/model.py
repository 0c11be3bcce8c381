"""The policy document: pydantic models, and a loader whose errors name file, line and key.

A policy is a YAML mapping (schema ``version: 1``)::

    version: 1
    data_classes: [public, internal, confidential, personal]   # least to most sensitive
    classification: {header: x-data-classification, grants: [...]}
    destinations: [{id, url | host+port(s) | cidr+ports, region, jurisdiction, operator, tags}]
    rules: [{id, effect, principals: {keys, teams}, classes, destinations, constraints}]
    unsafe_allow_all: false
    pii: {...}      # sensitive-data detection (policy.pii.config), optional

Everything is deny by default: a place that is not a destination cannot be reached, and a
request that no rule allows is refused. The ``revision`` of a policy is the SHA-256 of the
canonical JSON of the validated document (sorted keys, defaults filled in), so comments and
formatting do not change it but any change of meaning does.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from clishell import read_input_text

from .addresses import IPNetwork, check_spelling, parse_host, whole_families
from .errors import PolicyFileError
from .pii.config import PiiSection
from .pii.recognizers import BUILTIN
from .problems import KeyPath, PolicyProblem, dotted, line_of, validation_problems

Id = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")]
Port = Annotated[int, Field(ge=1, le=65535)]
Purpose = Literal["inference", "tool", "telemetry", "audit", "storage", "other"]

#: Default ports of the URL schemes a destination may use.
DEFAULT_PORTS: dict[str, int] = {
    "http": 80, "https": 443, "postgresql": 5432, "postgres": 5432, "redis": 6379,
    "rediss": 6379, "grpc": 443, "grpcs": 443,
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a destination is, in canonical form.

    Attributes:
        hostname: normalised DNS name, or ``None`` for address/CIDR destinations.
        network: the address (/32, /128) or CIDR, or ``None`` for hostname destinations.
        ports: allowed TCP ports.
        resolves_to: for hostname destinations, the networks resolved addresses must lie in
            (empty: any address that is not always denied or loopback).
        scheme: URL scheme when the destination was given as a URL.
    """

    hostname: str | None
    network: IPNetwork | None
    ports: frozenset[int]
    resolves_to: tuple[IPNetwork, ...]
    scheme: str | None


def _network(text: str) -> IPNetwork:
    ip = parse_host(text.split("/", 1)[0])
    if isinstance(ip, str):
        raise ValueError(f"{text!r} is not an address or CIDR")
    prefix = text.split("/", 1)[1] if "/" in text else str(ip.max_prefixlen)
    try:
        return ipaddress.ip_network(f"{ip}/{prefix}", strict=True)
    except ValueError as exc:
        raise ValueError(f"invalid CIDR {text!r}: {exc}") from exc


class Destination(_Strict):
    """One place the process may connect to (a model server, provider, collector, database)."""

    id: Id
    url: str | None = None
    host: str | None = None
    port: Port | None = None
    ports: list[Port] | None = None
    cidr: str | None = None
    resolves_to: list[str] = Field(default_factory=list)
    region: str = Field(min_length=1)
    jurisdiction: str = Field(min_length=1)
    operator: str = Field(min_length=1)
    tags: list[str] = Field(default_factory=list)
    purpose: Purpose = "inference"
    description: str = ""
    _endpoint: Endpoint = PrivateAttr()

    @model_validator(mode="after")
    def _compile(self) -> Destination:
        forms = [f for f in ("url", "host", "cidr") if getattr(self, f) is not None]
        if len(forms) != 1:
            raise ValueError("give exactly one of url, host (with port/ports) or cidr (with ports)")
        if self.port is not None and self.ports is not None:
            raise ValueError("give port or ports, not both")
        ports = set(self.ports or ()) | ({self.port} if self.port is not None else set())
        scheme: str | None = None
        for field in ("host", "cidr"):
            if (value := getattr(self, field)) is not None:
                check_spelling(value, f"{field} of destination {self.id!r}")
        for item in self.resolves_to:
            check_spelling(item, f"resolves_to of destination {self.id!r}")
        if self.url is not None:
            parts = urlsplit(self.url)
            scheme = parts.scheme.lower()
            if not parts.hostname:
                raise ValueError(f"url {self.url!r} has no host")
            try:
                url_port = parts.port
            except ValueError as exc:
                raise ValueError(f"url {self.url!r}: {exc}") from exc
            url_port = url_port or DEFAULT_PORTS.get(scheme)
            if url_port is None:
                raise ValueError(f"url {self.url!r}: scheme {scheme!r} needs an explicit port")
            ports.add(url_port)
            host_text: str | None = parts.hostname
            check_spelling(parts.hostname, f"url host of destination {self.id!r}")
            if not self.url.isascii():
                raise ValueError(f"url of destination {self.id!r} {self.url!r} holds non-ASCII "
                                 "characters: write it in ASCII (percent-encoded)")
        else:
            host_text = self.host
        if not ports:
            raise ValueError("a destination needs port or ports (deny by default: no 'any port')")
        hostname: str | None = None
        network: IPNetwork | None = None
        if self.cidr is not None:
            network = _network(self.cidr)
        elif host_text is not None:
            parsed = parse_host(host_text)
            if isinstance(parsed, str):
                hostname = parsed
            else:
                network = ipaddress.ip_network(parsed)
        if network is not None and network.prefixlen == 0:
            raise ValueError("a destination may not cover every address (/0)")
        if self.resolves_to and hostname is None:
            raise ValueError("resolves_to only applies to hostname destinations")
        resolves_to = tuple(_network(n) for n in self.resolves_to)
        self._endpoint = Endpoint(hostname, network, frozenset(ports), resolves_to, scheme)
        return self

    @property
    def endpoint(self) -> Endpoint:
        """The canonical endpoint (hostname or network, ports)."""
        return self._endpoint


class Grant(_Strict):
    """Who may change the data class of their requests with the classification header."""

    id: Id
    keys: list[str] = Field(default_factory=list)
    teams: list[str] = Field(default_factory=list)
    lower: bool = False
    raise_: bool = Field(default=False, alias="raise")
    classes: list[str] | None = None


class Classification(_Strict):
    """How a request's data class is chosen: the key's default, changed only under a grant."""

    header: str = "x-data-classification"
    grants: list[Grant] = Field(default_factory=list)


class Principals(_Strict):
    """Keys and teams a rule applies to; both empty means everyone."""

    keys: list[str] = Field(default_factory=list)
    teams: list[str] = Field(default_factory=list)


class Constraints(_Strict):
    """What a destination must be for an ``allow`` rule to allow it."""

    jurisdiction: str | list[str] | None = None
    regions: list[str] | None = None
    require_tags: list[str] = Field(default_factory=list)
    operators: list[str] | None = None


class RuleAudit(_Strict):
    """What the audit log records for requests a rule allows.

    Attributes:
        content_hmac: store a keyed HMAC-SHA256 (the audit pseudonym key) of the request body
            and of the response body the client received, never the text. Off by default: no
            prompt or completion content, not even a digest, reaches the log.
    """

    content_hmac: bool = False


class Rule(_Strict):
    """One rule: who, with which data classes, to which destinations, under what constraints."""

    id: Id
    description: str = ""
    effect: Literal["allow", "deny"] = "allow"
    principals: Principals = Field(default_factory=Principals)
    classes: list[str] | None = None
    destinations: list[str] | None = None
    constraints: Constraints = Field(default_factory=Constraints)
    audit: RuleAudit = Field(default_factory=RuleAudit)


class PolicyDocument(_Strict):
    """The whole policy file (schema version 1)."""

    version: Literal[1]
    data_classes: list[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")]] = Field(
        min_length=1
    )
    classification: Classification = Field(default_factory=Classification)
    destinations: list[Destination] = Field(default_factory=list)
    rules: list[Rule] = Field(default_factory=list)
    unsafe_allow_all: bool = False
    pii: PiiSection | None = None


# --- loading ------------------------------------------------------------------------------------

Path_ = KeyPath


def _compose(text: str, file: str) -> tuple[Any, dict[Path_, int]]:
    """Parse YAML safely, recording the 1-based line of every key and list item."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        lines: dict[Path_, int] = {}
        if node is not None:
            _walk(node, (), lines, file)
            data = loader.construct_document(node)
        else:
            data = None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        raise PolicyFileError(
            f"not valid YAML: {exc.problem}", file=file,
            line=mark.line + 1 if mark is not None else None,
        ) from exc
    except yaml.YAMLError as exc:
        raise PolicyFileError(f"not valid YAML: {exc}", file=file) from exc
    finally:
        loader.dispose()
    return data, lines


def _walk(node: yaml.Node, path: Path_, lines: dict[Path_, int], file: str) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            if key in seen:
                raise PolicyFileError(
                    "duplicate key", file=file, line=key_node.start_mark.line + 1,
                    key=dotted((*path, key)),
                )
            seen.add(key)
            lines[(*path, key)] = key_node.start_mark.line + 1
            _walk(value_node, (*path, key), lines, file)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[(*path, i)] = item.start_mark.line + 1
            _walk(item, (*path, i), lines, file)


def _check_references(doc: PolicyDocument, file: str, lines: Mapping[Path_, int]) -> None:
    """Ids unique, references defined; every problem is reported, not only the first.

    Raises:
        PolicyFileError: one problem per duplicate or dangling reference.
    """
    problems: list[PolicyProblem] = []

    def fail(msg: str, path: Path_) -> None:
        problems.append(PolicyProblem(dotted(path), msg, file, line_of(lines, path)))

    classes = set(doc.data_classes)
    if len(classes) != len(doc.data_classes):
        fail("data classes must be unique", ("data_classes",))
    dest_ids: set[str] = set()
    for i, d in enumerate(doc.destinations):
        if d.id in dest_ids:
            fail(f"duplicate destination id {d.id!r}", ("destinations", i, "id"))
        dest_ids.add(d.id)
    rule_ids: set[str] = set()
    for i, r in enumerate(doc.rules):
        if r.id in rule_ids:
            fail(f"duplicate rule id {r.id!r}", ("rules", i, "id"))
        rule_ids.add(r.id)
        for j, c in enumerate(r.classes or ()):
            if c not in classes:
                fail(f"unknown data class {c!r}", ("rules", i, "classes", j))
        for j, dest in enumerate(r.destinations or ()):
            if dest not in dest_ids:
                fail(f"unknown destination {dest!r}", ("rules", i, "destinations", j))
    grant_ids: set[str] = set()
    for i, g in enumerate(doc.classification.grants):
        path: Path_ = ("classification", "grants", i)
        if g.id in grant_ids:
            fail(f"duplicate grant id {g.id!r}", (*path, "id"))
        grant_ids.add(g.id)
        for j, c in enumerate(g.classes or ()):
            if c not in classes:
                fail(f"unknown data class {c!r}", (*path, "classes", j))
        if not (g.lower or g.raise_):
            fail("a grant must allow lower or raise", path)
    if doc.pii is not None:
        for path_, c in doc.pii.classes_named():
            if c not in classes:
                fail(f"unknown data class {c!r}", path_)
        entities = {s.entity for s in BUILTIN} | {r.entity for r in doc.pii.recognizers}
        for i, pr in enumerate(doc.pii.rules):
            for j, e in enumerate(pr.entities or ()):
                if e not in entities:
                    fail(f"unknown entity type {e!r}", ("pii", "rules", i, "entities", j))
    networks = [(d.id, n) for d in doc.destinations if (n := d.endpoint.network) is not None]
    for everything in whole_families(n for _, n in networks):
        version = ipaddress.ip_network(everything).version
        named = ", ".join(f"{i} ({n})" for i, n in networks if n.version == version)
        fail(f"destinations together cover every IPv{version} address, as {everything} would: "
             f"{named}; a policy may not allow every address, however it is split",
             ("destinations",))
    if problems:
        raise PolicyFileError.of(problems)


def canonical_revision(doc: PolicyDocument) -> str:
    """Return ``sha256:<hex>`` of the canonical JSON of a validated document.

    A rule's ``audit`` section is left out while it is the default (so policies written before
    it existed keep their revision); any opt-in changes the revision.
    """
    data = doc.model_dump(mode="json", by_alias=True)
    default_audit = RuleAudit().model_dump(mode="json", by_alias=True)
    for rule in data["rules"]:
        if rule.get("audit") == default_audit:
            del rule["audit"]
    if data.get("pii") is None:  # policies without a pii section keep their revision
        data.pop("pii", None)
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()



def parse_document(text: str, file: str | Path = "<string>") -> tuple[PolicyDocument, str]:
    """Validate a policy document given as YAML text.

    Args:
        text: the YAML document.
        file: name used in error messages.

    Returns:
        ``(document, revision)`` where revision is ``sha256:<64 hex>``.

    Raises:
        PolicyFileError: invalid YAML, duplicate key, schema violations or dangling
            references; one ``file:line: key: problem`` line per problem (every schema
            violation, then every reference problem), also in ``problems``.
    """
    name = str(file)
    data, lines = _compose(text, name)
    if not isinstance(data, dict):
        raise PolicyFileError("a policy must be a YAML mapping", file=name, line=1)
    try:
        doc = PolicyDocument.model_validate(data)
    except ValidationError as exc:
        raise PolicyFileError.of(
            validation_problems(exc, file=name, lines=lines, model=PolicyDocument)) from None
    _check_references(doc, name, lines)
    return doc, canonical_revision(doc)


def load_document(path: str | Path) -> tuple[PolicyDocument, str]:
    """Read and validate a policy file.

    Raises:
        PolicyFileError: the file cannot be read or is invalid (see :func:`parse_document`).
    """
    p = Path(path)
    try:
        text = read_input_text(p)
    except (OSError, UnicodeDecodeError) as exc:
        err = PolicyFileError(f"cannot read policy: {exc}", file=p)
        err.code = "policy_unreadable"
        raise err from exc
    return parse_document(text, p)
