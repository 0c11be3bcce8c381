"""verify, sign and size on local paths make no network connection (audit-hook guard)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.hub_emulator import make_sharded
from tests.weights.cli_util import ROOT
from tests.weights.test_weights_verify import lock_dir
from weights import Lockfile

GUARD = textwrap.dedent("""
    # socket.bind is not egress (urllib3 probes IPv6 support by binding ::1 at import).
    import json, os, sys
    events = []
    def hook(event, args):
        if event in ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname",
                     "socket.sendto"):
            events.append([event, repr(args)[:200]])
            raise PermissionError(f"egress blocked by test guard: {event}")
    sys.addaudithook(hook)
    from weights.cli import main
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
    loaded = sorted(m for m in ("huggingface_hub", "httpx2", "weights.hub") if m in sys.modules)
    print(json.dumps({"code": code, "events": events, "loaded": loaded}), file=sys.stderr)
    sys.exit(0)
""")


def _guarded(args: list[str]) -> dict[str, object]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HF_ENDPOINT": "http://192.0.2.1:9",
           "HF_HUB_DISABLE_TELEMETRY": "1", "HOME": str(ROOT / ".nonexistent-home")}
    r = subprocess.run([sys.executable, "-c", GUARD, *args], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=120, check=True)
    return json.loads(r.stderr.strip().splitlines()[-1])


@pytest.fixture
def model(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    root = tmp_path / "model"
    root.mkdir()
    files = make_sharded([{"a": ("BF16", (64, 64))}, {"b": ("F32", (32,))}])
    files["config.json"] = json.dumps({
        "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
        "intermediate_size": 128, "torch_dtype": "bfloat16"}).encode()
    for name, data in files.items():
        (root / name).write_bytes(data)
    lock = tmp_path / "weights.lock"
    Lockfile((lock_dir(root),)).save(lock)
    key = ec.generate_private_key(ec.SECP256R1())
    priv, pub = tmp_path / "k.pem", tmp_path / "k.pub"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return root, lock, priv, pub


def test_guard_blocks_and_records_a_connection() -> None:
    # The guard itself works: a command that does try the network is recorded and blocked.
    out = _guarded(["pin", "org/model", "--lock", "/nonexistent/weights.lock"])
    assert out["code"] == 2
    assert out["events"], "the guard saw no connection attempt from pin"


def test_verify_sign_size_make_no_connection(model: tuple[Path, Path, Path, Path],
                                             tmp_path: Path) -> None:
    root, lock, priv, pub = model
    sig = tmp_path / "model.sig"
    for args in (
        ["verify", str(root), "--lock", str(lock), "--json"],
        ["sign", str(root), "--key", str(priv), "--out", str(sig), "-q"],
        ["verify", str(root), "--lock", str(lock), "--signature", str(sig),
         "--public-key", str(pub)],
        ["size", str(root), "--gpu-mem", "1GiB", "--context", "128", "--concurrency", "1",
             "--overhead", "1MiB", "--gpus-per-node", "1", "--json"],
    ):
        out = _guarded(args)
        assert out == {"code": 0, "events": [], "loaded": []}, (args, out)


def test_keyless_verification_reads_the_trust_root_file_and_never_fetches(
    model: tuple[Path, Path, Path, Path], tmp_path: Path
) -> None:
    import sigstore

    root, _, priv, _ = model
    trust_root = (Path(sigstore.__file__).parent / "_store"
                  / "https%3A%2F%2Ftuf-repo-cdn.sigstore.dev" / "trusted_root.json")
    assert trust_root.is_file()
    sig = tmp_path / "model.sig"
    assert _guarded(["sign", str(root), "--key", str(priv), "--out", str(sig), "-q"])["code"] == 0
    # A key-mode bundle is not a Sigstore certificate signature for this identity: refused
    # (exit 1), with the production trust root read from the file and no connection made.
    out = _guarded(["verify", str(root), "--no-lock", "--signature", str(sig),
                    "--identity", "publisher@example.com",
                    "--identity-provider", "https://accounts.google.com",
                    "--trust-root", str(trust_root)])
    assert out == {"code": 1, "events": [], "loaded": []}

