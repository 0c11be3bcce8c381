"""The bundle's ML bill of materials: a CycloneDX 1.6 ML-BOM, built with cyclonedx-python-lib.

``airgap pack`` writes ``ml-bom.cdx.json`` as an extra file of the bundle, so its sha256 is in
the signed index and ``airgap verify`` checks its bytes like any content. Each model is a
component of type ``machine-learning-model`` (CycloneDX 1.6 §``component.type``):

* ``name`` = repo id, ``version`` = commit, ``purl`` = ``pkg:huggingface/<org>/<name>@<commit>``
  (purl-spec type ``huggingface``), ``supplier`` = the organisation part of the repo id;
* ``licenses`` from the lockfile (SPDX id or expression when it is one, else a named licence);
* one nested ``file`` component per model file with its SHA-256 hash and the properties
  ``sovereign-gateway:serialisation`` (safetensors, gguf, pickle, data) and, for a scanned
  pickle, ``sovereign-gateway:scan`` (the verdict line with scanner name and version);
* properties ``sovereign-gateway:serialisation-formats`` (the set over the model's files) and,
  for a model locked from disk, ``sovereign-gateway:origin`` = ``local``,
  ``sovereign-gateway:origin-path``, and the purl built from the *claimed* upstream, marked by
  ``sovereign-gateway:upstream-claim`` = ``not verified``.

``airgap verify`` reads the BOM back from the payload and checks that it matches the index:
one model component per locked model with the locked commit, the file set with the same
SHA-256 values, the locked licence and scan verdicts (``mlbom_mismatch`` otherwise). Spec:
https://cyclonedx.org/docs/1.6/json/ ; purl types: package-url/purl-spec PURL-TYPES.rst.
"""

from __future__ import annotations

import hashlib
import json
import uuid
import zlib
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airgap.bundle import MAX_INDEX_BYTES, Index
from airgap.errors import Code, Problem
from weights import LockEntry, Lockfile

if TYPE_CHECKING:  # the library is imported by build_bom only: verify stays quick to start
    from cyclonedx.model.component import Component
    from packageurl import PackageURL

BOM_NAME = "ml-bom.cdx.json"
_NS = "sovereign-gateway"


def _purl(repo_id: str | None, commit: str | None) -> PackageURL | None:
    from packageurl import PackageURL

    if repo_id is None:
        return None
    org, _, name = repo_id.rpartition("/")
    return PackageURL(type="huggingface", namespace=org or None, name=name, version=commit)


def _model(entry: LockEntry, formats: dict[tuple[str, str], str]) -> Component:
    from cyclonedx.contrib.license.factories import LicenseFactory
    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.model.contact import OrganizationalEntity

    origin = entry.origin
    props = [Property(name=f"{_NS}:serialisation-formats", value=",".join(sorted(
        {formats.get((entry.repo_id, f.path), "data") for f in entry.files})))]
    if origin is None:
        purl = _purl(entry.repo_id, entry.commit)
    else:  # a claim is never the component's identity: no purl, the claim as properties
        purl = None
        props += [Property(name=f"{_NS}:origin", value=origin.kind),
                  Property(name=f"{_NS}:origin-path", value=origin.path)]
        claimed = _purl(origin.claimed_repo_id, origin.claimed_commit)
        if claimed is not None:
            props += [Property(name=f"{_NS}:upstream-claim", value="not verified"),
                      Property(name=f"{_NS}:upstream-claimed-purl", value=claimed.to_string())]
    files = []
    for f in entry.files:
        fprops = [Property(name=f"{_NS}:serialisation",
                           value=formats.get((entry.repo_id, f.path), "data"))]
        if f.scan is not None:
            fprops.append(Property(name=f"{_NS}:scan", value=f.scan))
        files.append(Component(
            type=ComponentType.FILE, name=f.path, bom_ref=f"{entry.repo_id}@{entry.commit}/"
            f"{f.path}", hashes=[HashType(alg=HashAlgorithm.SHA_256, content=f.sha256)],
            properties=fprops))
    org = entry.repo_id.rpartition("/")[0]
    return Component(
        type=ComponentType.MACHINE_LEARNING_MODEL,
        name=entry.repo_id,
        version=entry.commit,
        bom_ref=f"{entry.repo_id}@{entry.commit}",
        purl=purl,
        supplier=OrganizationalEntity(name=org) if org else None,
        licenses=[LicenseFactory().make_from_string(entry.license)] if entry.license else None,
        properties=props,
        components=files,
    )


def build_bom(lock: Lockfile, formats: dict[tuple[str, str], str], created_at: str,
              tool: str) -> bytes:
    """Return the ML-BOM JSON (UTF-8) for the models of ``lock``.

    Args:
        lock: The pins being packed (with scan verdicts).
        formats: ``(repo_id, path)`` -> serialisation format found by content.
        created_at: UTC timestamp ``YYYY-MM-DDTHH:MM:SSZ`` (the BOM's metadata timestamp).
        tool: Name and version of the packer (recorded as a property).

    Returns:
        The CycloneDX 1.6 JSON document; its serial number is derived from the lock (the same
        pins give the same serial number).
    """
    from cyclonedx.model import Property
    from cyclonedx.model.bom import Bom
    from cyclonedx.output.json import JsonV1Dot6

    serial = uuid.uuid5(uuid.NAMESPACE_URL, f"{_NS}:mlbom:{lock.dumps()}")
    bom = Bom(serial_number=serial, components=[_model(e, formats) for e in lock.entries],
              properties=[Property(name=f"{_NS}:packer", value=tool)])
    bom.metadata.timestamp = datetime.strptime(created_at, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=UTC)
    text: str = str(JsonV1Dot6(bom).output_as_string(indent=2))
    return (text + "\n").encode("utf-8")


def read_extra(bundle: Path, index: Index, name: str) -> bytes | None:
    """The content of extra file ``name`` read from the payload parts, or None if the bundle
    has no such extra or it cannot be read back intact (``verify`` reports that itself)."""
    extra = next((f for f in index.extras if f.path == name), None)
    blob = next((b for b in index.blobs if extra and b.sha256 == extra.sha256), None)
    if extra is None or blob is None or blob.size > MAX_INDEX_BYTES:
        return None
    chunks = []
    try:
        for seg in index.segments(blob.offset, blob.stored_size):
            with (bundle / seg.part.name).open("rb") as fh:
                fh.seek(seg.start)
                chunks.append(fh.read(seg.length))
        data = b"".join(chunks)
        if blob.encoding == "zlib":
            d = zlib.decompressobj()
            data = d.decompress(data, blob.size + 1)
    except (OSError, zlib.error):
        return None
    return data if hashlib.sha256(data).hexdigest() == blob.sha256 else None


def check_bom(bom: bytes, index: Index) -> list[Problem]:
    """Problems where the ML-BOM does not describe exactly the index's models and files."""
    def bad(msg: str) -> Problem:
        return Problem(str(Code.MLBOM_MISMATCH), f"{BOM_NAME}: {msg}", path=f"extra:{BOM_NAME}")

    try:
        doc = json.loads(bom)
        comps = [c for c in doc.get("components", []) if c.get("type") == "machine-learning-model"]
    except (ValueError, AttributeError, TypeError):
        return [bad("not a CycloneDX JSON document")]
    if doc.get("bomFormat") != "CycloneDX" or doc.get("specVersion") != "1.6":
        return [bad("not a CycloneDX 1.6 document")]
    problems: list[Problem] = []
    by_name = {c.get("name"): c for c in comps}
    locked = {e.repo_id for e in index.lock.entries}
    for extra in sorted(set(by_name) - locked, key=str):
        problems.append(bad(f"model {extra} is not in the index"))
    for e in index.lock.entries:
        c = by_name.get(e.repo_id)
        if c is None:
            problems.append(bad(f"model {e.repo_id} is missing"))
            continue
        if c.get("version") != e.commit:
            problems.append(bad(f"{e.repo_id}: commit {c.get('version')} != {e.commit}"))
        got = {f.get("name"): _sha256(f) for f in c.get("components", [])}
        want = {f.path: f.sha256 for f in e.files}
        if got != want:
            diff = sorted(set(got.items()) ^ set(want.items()), key=str)
            problems.append(bad(f"{e.repo_id}: file hashes differ from the index "
                                f"(first: {diff[0][0]})"))
        scans = {f.get("name"): _prop(f, f"{_NS}:scan") for f in c.get("components", [])}
        if scans != {f.path: f.scan for f in e.files}:
            problems.append(bad(f"{e.repo_id}: scan verdicts differ from the index"))
        lic = _licence(c)
        if (e.license or None) != lic and (e.license or "").lower() != (lic or "").lower():
            problems.append(bad(f"{e.repo_id}: licence {lic} != {e.license}"))
    return problems


def _sha256(comp: dict[str, Any]) -> str | None:
    for h in comp.get("hashes", []):
        if h.get("alg") == "SHA-256":
            return str(h.get("content"))
    return None


def _prop(comp: dict[str, Any], name: str) -> str | None:
    for p in comp.get("properties", []):
        if p.get("name") == name:
            return str(p.get("value"))
    return None


def _licence(comp: dict[str, Any]) -> str | None:
    for item in comp.get("licenses", []):
        if "expression" in item:
            return str(item["expression"])
        lic = item.get("license", {})
        return str(lic.get("id") or lic.get("name"))
    return None


def summary(bom: bytes) -> list[str]:
    """One line per model component (for ``airgap inspect``)."""
    doc = json.loads(bom)
    lines = [f"ML-BOM {BOM_NAME}: CycloneDX {doc.get('specVersion')}, serial "
             f"{doc.get('serialNumber')}"]
    for c in doc.get("components", []):
        formats = _prop(c, f"{_NS}:serialisation-formats")
        scanned = sum(1 for f in c.get("components", []) if _prop(f, f"{_NS}:scan"))
        lines.append(f"  {c.get('type')} {c.get('name')}@{c.get('version')} "
                     f"purl {c.get('purl', '-')} licence {_licence(c) or '-'}, "
                     f"{len(c.get('components', []))} files, formats {formats}, "
                     f"{scanned} scanned pickle(s)")
    return lines


__all__ = ["BOM_NAME", "build_bom", "check_bom", "read_extra", "summary"]
