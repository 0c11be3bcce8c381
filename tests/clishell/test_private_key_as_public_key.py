"""Every verifying command that takes a public key names the slip of passing the private key.

``--public-key audit.key`` instead of ``audit.key.pub`` is the operator's most likely mistake
with the key pairs the four keygens write; each key parser used to answer with its own format
error (``verifier key is not valid base64``, cryptography's PEM message). Each command must
say that the file is a private key and which file to pass, exit 2, and quote nothing of the key.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import airgap.cli
import gateway.cli
import weights.cli
from clishell import public_key_path


def _keygen(main: Callable[[list[str] | None], int], argv: list[str]) -> None:
    assert main(argv) == 0


def _gateway_audit_verify_proof(tmp: Path) -> tuple[Callable[..., int], list[str], Path]:
    key = tmp / "audit.key"
    _keygen(gateway.cli.main, ["audit", "keygen", "--out", str(key)])
    proof = tmp / "proof.json"
    proof.write_text('{"format": "sovereign-gateway/audit-proof/v1", "entries": []}')
    return gateway.cli.main, ["audit", "verify-proof", str(proof), "--public-key", str(key)], key


def _gateway_audit_verify(tmp: Path) -> tuple[Callable[..., int], list[str], Path]:
    key = tmp / "audit.key"
    _keygen(gateway.cli.main, ["audit", "keygen", "--out", str(key)])
    store = f"sqlite://{tmp / 'audit.db'}"
    return gateway.cli.main, ["audit", "verify", "--store", store, "--public-key", str(key)], key


def _gateway_preflight_verify(tmp: Path) -> tuple[Callable[..., int], list[str], Path]:
    key = tmp / "operator.pem"
    _keygen(airgap.cli.main, ["keygen", "--out", str(key)])  # an Ed25519 PEM pair
    (tmp / "pack").mkdir()
    return gateway.cli.main, ["preflight", "verify", str(tmp / "pack"), "--key", str(key)], key


def _airgap_verify(tmp: Path) -> tuple[Callable[..., int], list[str], Path]:
    key = tmp / "site.pem"
    _keygen(airgap.cli.main, ["keygen", "--out", str(key)])
    (tmp / "bundle").mkdir()
    return airgap.cli.main, ["verify", str(tmp / "bundle"), "-k", str(key), "-q"], key


def _weights_verify(tmp: Path) -> tuple[Callable[..., int], list[str], Path]:
    key = tmp / "signer.pem"
    _keygen(weights.cli.main, ["keygen", "--out", str(key)])
    model, lock = tmp / "model", tmp / "weights.lock"
    model.mkdir()
    (model / "config.json").write_text("{}")
    _keygen(weights.cli.main, ["lock", str(model), "--repo-id", "org/m", "--lock", str(lock),
                               "-q"])
    (tmp / "model.sig").write_text("{}")
    return weights.cli.main, ["verify", str(model), "--lock", str(lock), "--signature",
                              str(tmp / "model.sig"), "--public-key", str(key), "-q"], key


@pytest.mark.parametrize("case", [
    _gateway_audit_verify_proof, _gateway_audit_verify, _gateway_preflight_verify,
    _airgap_verify, _weights_verify,
], ids=lambda f: f.__name__.strip("_"))
def test_private_key_given_as_public_key_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
    case: Callable[[Path], tuple[Callable[..., int], list[str], Path]],
) -> None:
    main, argv, private = case(tmp_path)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if ": error [" in line]
    assert len(lines) == 1, err
    assert f"{private} is a private (signing) key, not a public key" in lines[0]
    assert f"pass its public key ({public_key_path(private)}" in lines[0]
    secret = private.read_text()
    for chunk in (secret[i:i + 16] for i in range(0, len(secret), 16)):
        if chunk.strip() and "PRIVATE" not in chunk and "-----" not in chunk:
            assert chunk not in err
