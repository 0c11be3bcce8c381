"""OCI model artifacts: a verified bundle's model as an OCI image layout with ModelPack media
types, and an offline check of such an artifact (``airgap oci-export`` / ``airgap oci-verify``).

Layout (OCI image-layout 1.0: ``oci-layout``, ``index.json``, ``blobs/sha256/<hex>``), one
manifest per export, tagged with ``org.opencontainers.image.ref.name``::

    manifest  application/vnd.oci.image.manifest.v1+json
      artifactType application/vnd.cncf.model.manifest.v1+json           (CNCF ModelPack v1)
      config       application/vnd.cncf.model.config.v1+json             descriptor/modelfs/config
      layers       one per model file, uncompressed, annotation org.cncf.model.filepath:
                   application/vnd.cncf.model.weight.v1.raw         safetensors, GGUF, pickle
                   application/vnd.cncf.model.doc.v1.raw            README*, LICENSE*, *.md
                   application/vnd.cncf.model.weight.config.v1.raw  everything else
                   then the signature, as two layers under .airgap/:
                   application/vnd.sovereign-gateway.airgap.index.v1+json    the bundle index.json
                   application/vnd.sovereign-gateway.airgap.index-sig.v1     its Ed25519 index.sig

A layer's digest is the sha256 of the file, which is what the lockfile pins: the chain of
trust is trusted key -> signed index -> pinned sha256 -> layer digest -> blob bytes. The
signature travels inside the manifest (not as an OCI referrer) so that a plain ``skopeo copy``
to a registry and back keeps it. Media types: modelpack/model-spec ``specs-go/v1/mediatype.go``
and ``annotations.go``; layout: opencontainers/image-spec ``image-layout.md``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from airgap.bundle import INDEX_NAME, MAX_INDEX_BYTES, SIGNATURE_NAME, Index
from airgap.errors import AirgapError, Code, Problem, VerificationFailed
from airgap.signing import MAX_SIGNATURE_BYTES, verify_index_signature
from airgap.space import require_parent_dir
from airgap.unpack import unpack_bundle
from airgap.validate import parse_index
from weights import DEFAULT_POLICY, LockEntry, SerialisationPolicy, sha256_file

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
ARTIFACT = "application/vnd.cncf.model.manifest.v1+json"
CONFIG = "application/vnd.cncf.model.config.v1+json"
WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
WEIGHT_CONFIG = "application/vnd.cncf.model.weight.config.v1.raw"
DOC = "application/vnd.cncf.model.doc.v1.raw"
SIGNED_INDEX = "application/vnd.sovereign-gateway.airgap.index.v1+json"
SIGNATURE = "application/vnd.sovereign-gateway.airgap.index-sig.v1"
FILEPATH = "org.cncf.model.filepath"
REF_NAME = "org.opencontainers.image.ref.name"
_WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".ckpt", ".pkl")


@dataclass
class OciReport:
    """Outcome of :func:`verify_oci`: the repo id and commit, and every problem found."""

    layout: Path
    repo_id: str | None = None
    commit: str | None = None
    signer: str | None = None
    layers: dict[str, str] = field(default_factory=dict)  # path -> "sha256:<hex>"
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems


def media_type(path: str) -> str:
    """The ModelPack media type of a model file by its path."""
    name = path.rsplit("/", 1)[-1].lower()
    if name.endswith(_WEIGHT_SUFFIXES):
        return WEIGHT
    if name.startswith(("readme", "license", "licence")) or name.endswith(".md"):
        return DOC
    return WEIGHT_CONFIG


def _put(blobs: Path, data: bytes) -> dict[str, Any]:
    sha = hashlib.sha256(data).hexdigest()
    (blobs / sha).write_bytes(data)
    return {"digest": f"sha256:{sha}", "size": len(data)}


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, indent=2, sort_keys=True).encode("utf-8")


def export_oci(
    bundle: Path,
    trusted: Sequence[Ed25519PublicKey],
    out: Path,
    *,
    repo_id: str | None = None,
    tag: str | None = None,
    policy: SerialisationPolicy = DEFAULT_POLICY,
) -> Path:
    """Verify ``bundle`` and write one model of it as an OCI image layout at ``out``.

    Args:
        bundle: the bundle directory.
        trusted: accepted signer public keys.
        out: the layout directory to create (must not exist).
        repo_id: the model to export (needed when the bundle holds several).
        tag: the reference name (default: the first 12 hex of the commit).
        policy: serialisation policy, as for ``unpack``.

    Returns:
        ``out``.

    Raises:
        VerificationFailed: the bundle does not verify (nothing is left behind).
        AirgapError: ``output_exists``, ``io_error``, or an unknown/ambiguous ``repo_id``.
    """
    if out.exists() or out.is_symlink():
        raise AirgapError(Code.OUTPUT_EXISTS, f"{out} exists; choose a new path")
    require_parent_dir(out, "--out")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        store = tmp / "store"
        report = unpack_bundle(bundle, trusted, store, layout="dir", policy=policy)
        index = report.check.index
        assert index is not None
        entry = _pick(index, repo_id)
        blobs = tmp / "blobs" / "sha256"
        blobs.mkdir(parents=True)
        layers = []
        for f in entry.files:
            dst = blobs / f.sha256
            if not dst.exists():
                os.rename(report.locations[entry.repo_id] / f.path, dst)
            layers.append({"mediaType": media_type(f.path), "digest": f"sha256:{f.sha256}",
                           "size": f.size, "annotations": {FILEPATH: f.path}})
        index_bytes = (bundle / INDEX_NAME).read_bytes()
        sig_bytes = (bundle / SIGNATURE_NAME).read_bytes()
        for data, mt, name in ((index_bytes, SIGNED_INDEX, INDEX_NAME),
                               (sig_bytes, SIGNATURE, SIGNATURE_NAME)):
            layers.append({"mediaType": mt, **_put(blobs, data),
                           "annotations": {FILEPATH: f".airgap/{name}"}})
        config = _config(index, entry, [x["digest"] for x in layers])
        manifest = {
            "schemaVersion": 2, "mediaType": MANIFEST, "artifactType": ARTIFACT,
            "config": {"mediaType": CONFIG, **_put(blobs, _dumps(config))},
            "layers": layers,
            "annotations": {"org.opencontainers.image.title": entry.repo_id,
                            "org.opencontainers.image.revision": entry.commit},
        }
        ref = tag or entry.commit[:12]
        desc = {"mediaType": MANIFEST, "artifactType": ARTIFACT,
                **_put(blobs, _dumps(manifest)), "annotations": {REF_NAME: ref}}
        (tmp / "index.json").write_bytes(_dumps({"schemaVersion": 2, "manifests": [desc]}))
        (tmp / "oci-layout").write_bytes(_dumps({"imageLayoutVersion": "1.0.0"}))
        shutil.rmtree(store)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _config(index: Index, entry: LockEntry, diff_ids: list[Any]) -> dict[str, Any]:
    """The ModelPack config of ``entry``: everything in it follows from the signed index and
    the layer digests, so ``verify_oci`` rebuilds it and refuses any edit (licences, format)."""
    return {
        "descriptor": {"name": entry.repo_id, "revision": entry.commit,
                       "createdAt": index.created_at,
                       **({"licenses": [entry.license]} if entry.license else {})},
        "modelfs": {"type": "layers", "diffIds": diff_ids},
        "config": {},
    }


def _pick(index: Index, repo_id: str | None) -> LockEntry:
    entries = index.lock.entries
    if repo_id is None:
        if len(entries) != 1:
            raise AirgapError(Code.IO_ERROR, "the bundle holds several models; choose one with "
                              f"--repo ({', '.join(e.repo_id for e in entries)})")
        return entries[0]
    for e in entries:
        if e.repo_id == repo_id:
            return e
    raise AirgapError(Code.IO_ERROR, f"{repo_id} is not in the bundle")


def _read(layout: Path, digest: str, limit: int) -> bytes:
    algo, _, hexd = digest.partition(":")
    if algo != "sha256" or len(hexd) != 64 or not all(c in "0123456789abcdef" for c in hexd):
        raise VerificationFailed([Problem(str(Code.OCI_INVALID), f"unsupported digest {digest!r}")])
    p = layout / "blobs" / "sha256" / hexd
    try:
        if p.is_symlink() or p.stat().st_size > limit:
            raise VerificationFailed([Problem(str(Code.OCI_INVALID),
                                              f"blob {hexd[:12]} is a symlink or too large")])
        data = p.read_bytes()
    except OSError as exc:
        raise VerificationFailed([Problem(str(Code.OCI_INVALID),
                                          f"blob {hexd[:12]} unreadable: {exc}")]) from exc
    if hashlib.sha256(data).hexdigest() != hexd:
        raise VerificationFailed([Problem(str(Code.OCI_DIGEST_MISMATCH),
                                          f"blob {hexd[:12]} does not match its digest")])
    return data


def verify_oci(layout: Path, trusted: Sequence[Ed25519PublicKey],
               *, tag: str | None = None) -> OciReport:
    """Verify an OCI model artifact offline: structure, the signed index, every layer's bytes.

    Args:
        layout: an OCI image layout directory (as written by :func:`export_oci`, or pulled
            back from a registry with ``skopeo copy docker://... oci:DIR:TAG``).
        trusted: accepted signer public keys.
        tag: the reference to check (default: the only manifest).

    Returns:
        The report: ``ok`` when the signature verifies, the files are exactly the signed
        lock's, and every layer blob hashes to its pinned sha256.
    """
    report = OciReport(layout=layout)
    try:
        _verify(layout, trusted, tag, report)
    except VerificationFailed as exc:
        report.problems.extend(exc.problems)
    return report


def _verify(layout: Path, trusted: Sequence[Ed25519PublicKey], tag: str | None,
            report: OciReport) -> None:
    def bad(code: Code, msg: str) -> VerificationFailed:
        return VerificationFailed([Problem(str(code), msg)])

    try:
        top = json.loads((layout / "index.json").read_bytes())
        manifests = top["manifests"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise bad(Code.OCI_INVALID, f"{layout}: not an OCI image layout ({exc})") from exc
    chosen = [m for m in manifests if tag is None
              or m.get("annotations", {}).get(REF_NAME) == tag]
    if len(chosen) != 1:
        raise bad(Code.OCI_INVALID, f"{layout}: {len(chosen)} manifest(s) match tag {tag!r}")
    manifest = json.loads(_read(layout, chosen[0]["digest"], MAX_INDEX_BYTES))
    if manifest.get("artifactType") != ARTIFACT or manifest.get("config", {}).get(
            "mediaType") != CONFIG:
        raise bad(Code.OCI_INVALID, "not a CNCF ModelPack v1 model manifest")
    layers = manifest.get("layers")
    if not isinstance(layers, list) or not all(isinstance(x, dict) for x in layers):
        raise bad(Code.OCI_INVALID, "the manifest's layers are not a list of descriptors")
    signed = _signature_layers(layers)
    if signed is None:
        raise bad(Code.SIGNATURE_MISSING, "the artifact carries no signed airgap index")
    index_bytes = _read(layout, str(layers[signed[0]].get("digest")), MAX_INDEX_BYTES)
    sig = _read(layout, str(layers[signed[1]].get("digest")), MAX_SIGNATURE_BYTES)
    report.signer = verify_index_signature(index_bytes, sig, trusted)
    index = parse_index(index_bytes)
    config = json.loads(_read(layout, manifest["config"]["digest"], MAX_INDEX_BYTES))
    name = config.get("descriptor", {}).get("name")
    entry = next((e for e in index.lock.entries if e.repo_id == name), None)
    if entry is None:
        raise bad(Code.OCI_INVALID, f"model {name!r} of the config is not in the signed index")
    report.repo_id, report.commit = entry.repo_id, entry.commit
    if config["descriptor"].get("revision") != entry.commit:
        report.problems.append(Problem(str(Code.PIN_MISMATCH), "config revision "
                                       f"{config['descriptor'].get('revision')} != {entry.commit}"))
    expected = _config(index, entry, [x.get("digest") for x in layers])
    if config != expected:
        keys = sorted(k for k in {*expected, *config} if config.get(k) != expected.get(k))
        report.problems.append(Problem(str(Code.OCI_INVALID), "the config differs from what "
                                       f"the signed index gives ({', '.join(keys)})"))
    # Every layer is accounted for: the two signature layers, then one layer per pinned file;
    # any other layer (no file path, a path twice, a path the lock does not pin) fails.
    got: dict[str, dict[str, Any]] = {}
    for i, x in enumerate(layers):
        if i in signed:
            continue
        path = x.get("annotations", {}).get(FILEPATH) if isinstance(
            x.get("annotations"), dict) else None
        if not isinstance(path, str) or not path:
            report.problems.append(Problem(
                str(Code.PIN_MISMATCH), f"{_layer_label(i, x)} has no {FILEPATH} annotation: "
                "it is not pinned by the signed lock", path=_layer_label(i, x)))
        elif path in got:
            report.problems.append(Problem(
                str(Code.OCI_INVALID), f"{_layer_label(i, x)}: two layers share file path "
                f"{path!r}", path=path))
        else:
            got[path] = x
    for f in entry.files:
        layer = got.pop(f.path, None)
        label = f"{entry.repo_id}:{f.path}"
        if layer is None:
            report.problems.append(Problem(str(Code.PIN_MISMATCH), f"{label}: no layer",
                                           path=label))
            continue
        want = f"sha256:{f.sha256}"
        if layer.get("mediaType") != media_type(f.path):
            report.problems.append(Problem(str(Code.OCI_INVALID),
                                           f"{label}: layer media type differs from the pin's",
                                           path=label, expected=media_type(f.path),
                                           actual=str(layer.get("mediaType"))))
        if layer.get("digest") != want or layer.get("size") != f.size:
            report.problems.append(Problem(str(Code.PIN_MISMATCH),
                                           f"{label}: layer digest differs from the pin",
                                           path=label, expected=want, actual=layer.get("digest")))
            continue
        blob = layout / "blobs" / "sha256" / f.sha256
        try:
            actual = sha256_file(blob) if not blob.is_symlink() else "symlink"
        except Exception as exc:
            actual = f"unreadable ({exc})"
        if actual != f.sha256:
            report.problems.append(Problem(str(Code.OCI_DIGEST_MISMATCH),
                                           f"{label}: blob bytes differ from the pin",
                                           path=label, expected=f.sha256, actual=actual))
        report.layers[f.path] = want
    for extra in sorted(got):
        i = next(n for n, x in enumerate(layers) if x is got[extra])
        report.problems.append(Problem(
            str(Code.PIN_MISMATCH), f"{_layer_label(i, got[extra])} ({extra!r}) is not pinned "
            "by the signed lock", path=extra))


def _layer_label(i: int, layer: dict[str, Any]) -> str:
    """``layer N (<media type>, sha256:<12 hex>)``: names a layer that has no usable path."""
    digest = str(layer.get("digest", "?"))
    return f"layer {i} ({layer.get('mediaType')!s}, {digest[:19]})"


def _signature_layers(layers: list[dict[str, Any]]) -> tuple[int, int] | None:
    """Positions of the signed index layer and its signature layer.

    Returns:
        ``(index, signature)``, or None when the manifest has neither.

    Raises:
        VerificationFailed: Not exactly one layer of each media type, or one not at its
            ``.airgap/`` path (a second index-typed layer would be left out of the pin check
            and written by an extractor under its own file path).
    """
    found: list[int] = []
    for media, name in ((SIGNED_INDEX, INDEX_NAME), (SIGNATURE, SIGNATURE_NAME)):
        at = [i for i, x in enumerate(layers) if x.get("mediaType") == media]
        if not at:
            return None
        paths = [layers[i].get("annotations", {}).get(FILEPATH)
                 if isinstance(layers[i].get("annotations"), dict) else None for i in at]
        if len(at) != 1 or paths[0] != f".airgap/{name}":
            named = ", ".join(f"{_layer_label(i, layers[i])} at {p!r}" for i, p in zip(at, paths,
                                                                                 strict=True))
            raise VerificationFailed([Problem(
                str(Code.PIN_MISMATCH), f"the manifest must carry exactly one {media} layer, "
                f"at .airgap/{name}; found {named}")])
        found.append(at[0])
    return found[0], found[1]


__all__ = ["OciReport", "export_oci", "media_type", "verify_oci"]
