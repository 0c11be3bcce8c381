"""The error lines a new operator met on a fresh clone, each with a specific code and a hint.

``gateway audit keygen`` onto an existing key, ``airgap verify`` of a path that is no bundle,
``weights verify --lock`` of a missing lockfile (the hint named only the online ``weights pin``,
never the offline ``weights lock DIR``), ``weights sign`` onto a signature and ``weights plan``
of a missing file (both the generic ``weights_error``): run piped, as a script or CI does.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.terminal import piped

PY = sys.executable


def _err(argv: list[str], cwd: Path) -> str:
    run = piped([PY, "-m", *argv], cwd=cwd)
    assert run.returncode == 2, run.stderr
    assert run.stdout == "", run.stdout
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    return lines[0]


def test_audit_keygen_onto_an_existing_key(tmp_path: Path) -> None:
    assert piped([PY, "-m", "gateway.cli", "audit", "keygen", "--out", "k"],
                 cwd=tmp_path).returncode == 0
    before = (tmp_path / "k").read_bytes()
    line = _err(["gateway.cli", "audit", "keygen", "--out", "k"], tmp_path)
    assert line == ("gateway: error [audit_key_exists]: k exists already; refusing to overwrite "
                    "a key (hint: keep it (checkpoints and pseudonyms made with it need it), or "
                    "choose another --out; remove it first only if nothing was made with it)")
    assert (tmp_path / "k").read_bytes() == before


def test_airgap_verify_of_no_bundle(tmp_path: Path) -> None:
    assert piped([PY, "-m", "airgap.cli", "keygen", "--out", "k"], cwd=tmp_path).returncode == 0
    line = _err(["airgap.cli", "verify", "nobundle", "--public-key", "k.pub"], tmp_path)
    assert line == ("airgap: error [bundle_not_found]: nobundle is not a bundle directory (does "
                    "not exist) (hint: give the directory that `airgap pack --out` wrote: it "
                    "holds index.json, index.sig and the payload.* parts)")


def test_weights_verify_without_a_lockfile_names_the_offline_path(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    line = _err(["weights.cli", "verify", "model", "--lock", "nothere.lock"], tmp_path)
    assert line.startswith("weights: error [lockfile_invalid]: nothere.lock: lockfile not found")
    assert "`weights lock DIR --repo-id ORG/NAME --lock nothere.lock` (offline)" in line
    assert "`weights pin REPO_ID --lock nothere.lock` (online)" in line


def test_weights_sign_and_plan_use_specific_codes(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert piped([PY, "-m", "weights.cli", "keygen", "--out", "k.pem"],
                 cwd=tmp_path).returncode == 0
    sign = ["weights.cli", "sign", "model", "--key", "k.pem", "--out", "m.sig"]
    assert piped([PY, "-m", *sign], cwd=tmp_path).returncode == 0
    assert _err(sign, tmp_path).startswith(
        "weights: error [output_exists]: m.sig exists: not replacing a signature (hint: pass "
        "--force")
    assert _err(["weights.cli", "plan", "nothere.json"], tmp_path).startswith(
        "weights: error [target_not_found]: nothere.json: no such file or directory (hint: ")
