"""OSCAL output of the pre-flight: a component definition and the run's assessment results.

``gateway preflight --oscal DIR`` writes two OSCAL 1.2.1 JSON documents (NIST OSCAL,
pages.nist.gov/OSCAL; the version compliance-trestle 5.2 validates):

``component-definition.json``
    The appliance as one ``software`` component; one ``control-implementation`` per framework of
    :file:`mapping.yaml` (its ``source`` the framework's address), one
    ``implemented-requirement`` per control with the checks that evidence it.
``assessment-results.json``
    One ``result`` for the run: per check an ``observation`` (method ``TEST``, its verdict,
    ``relevant-evidence`` pointing at ``back-matter`` resources that carry the pack file's
    SHA-256) and, for a check that ran, a ``finding`` whose target is the check
    (``objective-id``) with state ``satisfied``/``not-satisfied`` and one ``evidences`` property
    per control it maps to. Skipped checks have an observation and no finding.

The mapping is data (:file:`mapping.yaml`, schema ``sovereign-gateway/control-mapping/v1``):
every framework and control carries ``citation`` (``verified``, ``secondary`` or ``ours``), and
every check-to-control line is our judgement, not the framework's. OSCAL control ids are tokens,
so ``AIA-26(6)`` is written ``AIA-26.6`` (:func:`oscal_control_id`). UUIDs are version 5. Those of
the assessment results are derived from the run's evidence (the SHA-256 of every pack file,
report included) and the item's name and position: the same run gives the same bytes, and two
runs that differ in anything (two replicas in the same second, two regions) never share a
uuid (OSCAL: a uuid identifies one subject).
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from gateway.preflight.errors import EvidenceError
from gateway.preflight.report import MANUAL_ATTESTATIONS, CheckResult, Report

__all__ = ["NS", "OSCAL_VERSION", "Mapping", "assessment_results", "component_definition",
           "load_mapping", "mapping_table", "oscal_control_id", "oscal_files", "write_oscal"]

#: The OSCAL version written (compliance-trestle 5.2.0's models are generated for 1.2.1).
OSCAL_VERSION = "1.2.1"
#: Namespace of our own property names.
NS = "https://sovereign-gateway.dev/ns/oscal"
COMPONENT_FILE = "oscal/component-definition.json"
RESULTS_FILE = "oscal/assessment-results.json"
_ROOT = uuid.UUID("8f0c2b1e-7d4a-5c3e-9a61-2f5b8d7e4c10")


@dataclass(frozen=True, slots=True)
class Mapping:
    """The control mapping shipped as :file:`mapping.yaml`.

    Attributes:
        frameworks: Framework key -> ``{title, source, href, citation, controls: {id: {title,
            citation}}}``.
        checks: Check id -> ``{controls: [control id], evidence: [pack file]}``.
    """

    frameworks: dict[str, dict[str, Any]]
    checks: dict[str, dict[str, list[str]]]

    def framework_of(self, control: str) -> str:
        """The key of the framework that defines ``control``.

        Raises:
            KeyError: No framework defines it.
        """
        for key, fw in self.frameworks.items():
            if control in fw["controls"]:
                return key
        raise KeyError(control)

    def checks_for(self, control: str) -> list[str]:
        """Check ids mapped to ``control``, in mapping order."""
        return [cid for cid, m in self.checks.items() if control in m["controls"]]


def load_mapping() -> Mapping:
    """Read the packaged :file:`mapping.yaml` and check it is consistent.

    Raises:
        EvidenceError: A check names a control that no framework defines.
    """
    text = resources.files("gateway.preflight").joinpath("mapping.yaml").read_text("utf-8")
    data = yaml.safe_load(text)
    mapping = Mapping(dict(data["frameworks"]), dict(data["checks"]))
    for cid, m in mapping.checks.items():
        for control in m["controls"]:
            try:
                mapping.framework_of(control)
            except KeyError:
                raise EvidenceError(f"mapping.yaml: check {cid} names unknown control "
                                    f"{control}") from None
    return mapping


def mapping_table(mapping: Mapping) -> str:
    """The mapping as the Markdown table of docs/evidence.md (one row per check)."""
    def cell(control: str) -> str:
        fw = mapping.framework_of(control)
        mark = {"verified": "", "secondary": "†", "ours": "*"}[
            str(mapping.frameworks[fw]["controls"][control]["citation"])]
        return f"{control}{mark}"

    rows = ["| Check | EU CSF | CADA | BSI C5 | Grundschutz | AI Act |",
            "|---|---|---|---|---|---|"]
    for cid, m in mapping.checks.items():
        by_fw = {key: [cell(c) for c in m["controls"] if mapping.framework_of(c) == key]
                 for key in ("eu-csf", "cada", "bsi-c5", "bsi-grundschutz", "ai-act")}
        rows.append(f"| `{cid}` | " + " | ".join(", ".join(v) or "-" for v in by_fw.values())
                    + " |")
    return "\n".join(rows) + "\n"


def oscal_control_id(control: str) -> str:
    """``control`` as an OSCAL token (``AIA-26(6)`` -> ``AIA-26.6``)."""
    return control.replace("(", ".").replace(")", "")


def _uuid(*parts: str) -> str:
    return str(uuid.uuid5(_ROOT, "\x1f".join(parts)))


def _prop(name: str, value: str, cls: str | None = None) -> dict[str, str]:
    p = {"name": name, "value": value, "ns": NS}
    if cls is not None:
        p["class"] = cls
    return p


def _metadata(title: str, when: str, version: str) -> dict[str, Any]:
    return {"title": title, "last-modified": when, "version": version,
            "oscal-version": OSCAL_VERSION}


def _component_uuid() -> str:
    return _uuid("component", "sovereign-gateway")


def component_definition(mapping: Mapping, when: str, version: str) -> dict[str, Any]:
    """The appliance's OSCAL component definition (``{"component-definition": ...}``).

    Args:
        mapping: The control mapping.
        when: ISO 8601 UTC time for ``last-modified``.
        version: Document version (the product version).
    """
    impls = []
    for key, fw in mapping.frameworks.items():
        reqs = []
        for control, meta in fw["controls"].items():
            checks = mapping.checks_for(control)
            if not checks:
                continue
            reqs.append({
                "uuid": _uuid("req", key, control),
                "control-id": oscal_control_id(control),
                "description": (f"Evidenced by the pre-flight checks "
                                f"{', '.join(checks)} (our mapping to "
                                f"{control}: {meta['title']})."),
                "props": [_prop("citation", str(meta["citation"])),
                          _prop("framework-control-id", control)]
                + [_prop("check", c) for c in checks],
            })
        if reqs:
            impls.append({
                "uuid": _uuid("impl", key), "source": str(fw["href"]),
                "description": f"{fw['title']}. Source of the ids: {fw['source'].strip()}",
                "props": [_prop("citation", str(fw["citation"])), _prop("framework", key)],
                "implemented-requirements": reqs,
            })
    return {"component-definition": {
        "uuid": _uuid("component-definition", version),
        "metadata": _metadata("sovereign-gateway: controls evidenced by the pre-flight", when,
                              version),
        "components": [{
            "uuid": _component_uuid(), "type": "software", "title": "sovereign-gateway",
            "description": ("Self-hosted OpenAI-compatible gateway for in-region inference: "
                            "egress policy with a process guard, tamper-evident audit log with "
                            "signed checkpoints, pinned and signed weights."),
            "purpose": "Keep inference, its logs and its telemetry in the region.",
            "control-implementations": impls,
        }],
    }}


def _run_id(report: Report, files: dict[str, bytes]) -> str:
    """SHA-256 hex naming one run: its report and every evidence file, by digest."""
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    digests["\x00report"] = hashlib.sha256(_dump(report.to_json())).hexdigest()
    return hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()


def _observation(check: CheckResult, index: int, mapping: Mapping, when: str, run: str,
                 resources_by_file: dict[str, str]) -> dict[str, Any]:
    files = ["report.json", *mapping.checks.get(check.id, {}).get("evidence", [])]
    evidence = [{"href": f"#{resources_by_file[f]}",
                 "description": f"{f} (SHA-256 in back-matter)"
                 + (": the check's own evidence object, under checks[id]"
                    if f == "report.json" else "")}
                for f in files if f in resources_by_file]
    obs: dict[str, Any] = {
        "uuid": _uuid("observation", run, str(index), check.id), "title": check.id,
        "description": f"{check.title}: {check.verdict}",
        "props": [_prop("check-status", check.status), _prop("required", str(check.required))],
        "methods": ["TEST"], "types": ["finding" if check.status == "fail"
                                       else "control-objective"],
        "subjects": [{"subject-uuid": _component_uuid(), "type": "component"}],
        "collected": when,
    }
    if evidence:
        obs["relevant-evidence"] = evidence
    return obs


def assessment_results(report: Report, mapping: Mapping, files: dict[str, bytes],
                       version: str) -> dict[str, Any]:
    """The run as OSCAL assessment results (``{"assessment-results": ...}``).

    Args:
        report: The pre-flight report.
        mapping: The control mapping.
        files: The pack's evidence files (``{relative path: bytes}``), referenced by SHA-256.
        version: Document version.
    """
    when = report.generated_at
    run = _run_id(report, files)
    resources_by_file = {name: _uuid("resource", run, name) for name in sorted(files)}
    back_matter = [{
        "uuid": resources_by_file[name], "title": name,
        # Relative to this document, which a pack holds under oscal/ (RFC 3986 resolution).
        "rlinks": [{"href": f"../{name}", "hashes": [
            {"algorithm": "SHA-256", "value": hashlib.sha256(data).hexdigest()}]}],
    } for name, data in sorted(files.items())]
    observations, findings, controls = [], [], []
    for index, check in enumerate(report.checks):
        obs = _observation(check, index, mapping, when, run, resources_by_file)
        observations.append(obs)
        mapped = mapping.checks.get(check.id, {}).get("controls", list(check.criteria))
        controls += [c for c in mapped if c not in controls]
        if check.status == "skip":
            continue
        findings.append({
            "uuid": _uuid("finding", run, str(index), check.id), "title": check.id,
            "description": check.verdict,
            "props": [_prop("evidences", oscal_control_id(c), mapping.framework_of(c))
                      for c in mapped],
            "target": {"type": "objective-id", "target-id": check.id,
                       "status": {"state": "satisfied" if check.status == "pass"
                                  else "not-satisfied"}},
            "related-observations": [{"observation-uuid": obs["uuid"]}],
        })
    open_boxes = "; ".join(f"{m['criterion']}: {m['attest']}" for m in MANUAL_ATTESTATIONS)
    result: dict[str, Any] = {
        "uuid": _uuid("result", run),
        "title": f"sovereign-gateway pre-flight {when}",
        "description": (f"Result: {'fail' if report.exit_code else 'pass'}; "
                        f"{json.dumps(report.counts(), sort_keys=True)}."),
        "start": when, "end": when,
        "reviewed-controls": {"control-selections": [{"include-controls": [
            {"control-id": oscal_control_id(c)} for c in controls]}]},
        "observations": observations,
        "remarks": "Open manual attestations (not checked by software): " + open_boxes,
    }
    if findings:
        result["findings"] = findings
    return {"assessment-results": {
        "uuid": _uuid("assessment-results", run),
        "metadata": _metadata(f"sovereign-gateway pre-flight assessment {when}", when, version),
        "import-ap": {"href": "urn:sovereign-gateway:preflight:v1",
                      "remarks": ("No separate assessment plan: the plan is the fixed check "
                                  "set of gateway preflight, mapped to controls in "
                                  "component-definition.json.")},
        "results": [result],
        "back-matter": {"resources": back_matter},
    }}


def _dump(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def oscal_files(report: Report, evidence: dict[str, bytes]) -> dict[str, bytes]:
    """Both OSCAL documents as pack files (``oscal/...``), referencing ``evidence`` by digest.

    Raises:
        EvidenceError: The packaged mapping is inconsistent.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("sovereign-gateway")
    except PackageNotFoundError:
        ver = "0"
    mapping = load_mapping()
    return {COMPONENT_FILE: _dump(component_definition(mapping, report.generated_at, ver)),
            RESULTS_FILE: _dump(assessment_results(report, mapping, evidence, ver))}


def write_oscal(directory: Path, report: Report, evidence: dict[str, bytes]) -> dict[str, bytes]:
    """Write both OSCAL documents into ``directory`` (created if missing; files replaced).

    Args:
        directory: Where to write them.
        report: The pre-flight report.
        evidence: The pack's evidence files (:func:`gateway.preflight.evidence.evidence_files`),
            the very bytes later given to ``write_pack(..., evidence=...)``: the documents
            carry their digests.

    Returns:
        The files as written, keyed by their path inside an evidence pack (``oscal/...``).

    Raises:
        EvidenceError: A file cannot be written, or the packaged mapping is inconsistent.
    """
    files = oscal_files(report, evidence)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            tmp = directory / f".{PurePosixPath(name).name}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, directory / PurePosixPath(name).name)
    except OSError as exc:
        raise EvidenceError(f"cannot write OSCAL documents to {directory}: {exc}") from exc
    return files
