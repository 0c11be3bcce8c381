"""The weights CLI as an operator meets it: checks before any write, one-line errors."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.hub_emulator import make_sharded
from tests.hub_fixtures import SHARDED, HubServer
from tests.weights.cli_util import run_cli
from tests.weights.test_weights_verify import lock_dir
from weights import LockEntry, Lockfile, install_hf_cache


def _model(root: Path, tag: str) -> Path:
    root.mkdir(parents=True)
    files = make_sharded([{"a": ("BF16", (16, 16))}, {"b": ("F32", (8,))}])
    files["config.json"] = json.dumps({"model_type": "llama", "tag": tag}).encode() + b"\n"
    for name, data in files.items():
        (root / name).write_bytes(data)
    return root


@pytest.fixture
def two_models(tmp_path: Path) -> tuple[Path, Path, list[LockEntry]]:
    """A plain multi-model directory (``DIR/org/name`` as ``pull --into`` writes it), the
    matching lock and its entries."""
    plain = tmp_path / "models"
    entries = [lock_dir(_model(plain / repo, repo), repo, c * 40)
               for repo, c in (("org/alpha", "a"), ("org/beta", "b"))]
    lock = tmp_path / "weights.lock"
    Lockfile(tuple(entries)).save(lock)
    return plain, lock, entries


def test_verify_multi_model_plain_root_checks_every_model(
    two_models: tuple[Path, Path, list[LockEntry]],
) -> None:
    plain, lock, _ = two_models
    ok = run_cli(["verify", str(plain), "--lock", str(lock), "--json"])
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert [m["repo_id"] for m in doc["models"]] == ["org/alpha", "org/beta"]
    # Damage only the SECOND model: a root verify must not stop at the first one.
    (plain / "org/beta/config.json").write_bytes(b'{"model_type": "llamb"}\n')
    bad = run_cli(["verify", str(plain), "--lock", str(lock)])
    assert bad.returncode == 1, bad.stderr
    assert "org/beta: MISMATCH config.json" in bad.stdout
    assert "OK org/alpha" in bad.stdout


def test_verify_multi_model_cache_root_checks_every_model(
    two_models: tuple[Path, Path, list[LockEntry]], tmp_path: Path,
) -> None:
    plain, lock, entries = two_models
    cache = tmp_path / "cache"
    for e in entries:
        install_hf_cache(cache, e, {f.path: plain / e.repo_id / f.path for f in e.files})
    assert run_cli(["verify", str(cache), "--lock", str(lock)]).returncode == 0
    blob = cache / "models--org--beta" / "blobs" / entries[1].file("config.json").blob_id
    blob.write_bytes(b'{"model_type": "llamb"}\n')
    bad = run_cli(["verify", str(cache), "--lock", str(lock), "--json"])
    assert bad.returncode == 1, bad.stderr
    beta = json.loads(bad.stdout)["models"][1]
    assert beta["repo_id"] == "org/beta" and beta["mismatched"][0]["path"] == "config.json"


def test_verify_root_with_a_pinned_model_absent_fails(
    two_models: tuple[Path, Path, list[LockEntry]],
) -> None:
    plain, lock, entries = two_models
    for f in entries[1].files:
        (plain / "org/beta" / f.path).unlink()
    (plain / "org/beta").rmdir()
    bad = run_cli(["verify", str(plain), "--lock", str(lock), "--json"])
    assert bad.returncode == 1, bad.stderr
    beta = json.loads(bad.stdout)["models"][1]
    assert beta["missing"] == sorted(f.path for f in entries[1].files)


def test_verify_plain_model_dir_is_picked_by_its_org_name_path(
    two_models: tuple[Path, Path, list[LockEntry]],
) -> None:
    plain, lock, _ = two_models
    res = run_cli(["verify", str(plain / "org/beta"), "--lock", str(lock), "--json"])
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["lock"]["repo_id"] == "org/beta"


@pytest.mark.parametrize("revision", ["../../escape", "/abs", "a/../../b", "x\\y", ""])
def test_lock_with_unsafe_requested_revision_is_refused_before_any_write(
    two_models: tuple[Path, Path, list[LockEntry]], tmp_path: Path, revision: str,
) -> None:
    _, lock, _ = two_models
    doc = json.loads(lock.read_text())
    doc["models"][1]["requested_revision"] = revision
    lock.write_text(json.dumps(doc))
    cache = tmp_path / "deep" / "cache"
    res = run_cli(["pull", "--lock", str(lock), "--cache", str(cache)])
    assert res.returncode == 2, res.stderr
    assert "weights: error [lockfile_invalid]" in res.stderr
    assert "$.models[1].requested_revision: unsafe revision" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "deep").exists()


def test_sign_refuses_a_non_utf8_file_name_with_one_clear_line(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    model = _model(tmp_path / "m", "x")
    odd = os.fsdecode(b"\xff\xfe.bin")
    (model / odd).write_bytes(b"stray")
    key = tmp_path / "ec.pem"
    key.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    sig = tmp_path / "model.sig"
    res = run_cli(["sign", str(model), "--key", str(key), "--out", str(sig), "-q"])
    assert res.returncode == 1, res.stderr  # the tree rule lock and verify apply too
    assert "weights: error [unsafe_path]" in res.stderr
    assert "\\xff\\xfe.bin: file name is not valid UTF-8" in res.stderr
    assert "Traceback" not in res.stderr
    assert not sig.exists()


def test_verify_json_stays_valid_utf8_with_a_non_utf8_extra_file(
    two_models: tuple[Path, Path, list[LockEntry]],
) -> None:
    plain, lock, _ = two_models
    (plain / "org/beta" / os.fsdecode(b"\xff.bin")).write_bytes(b"x")
    res = run_cli(["verify", str(plain / "org/beta"), "--lock", str(lock), "--json"],
                  text=False)
    assert res.returncode == 1
    # The tree rule sign and lock apply: the name is refused, in valid UTF-8.
    text = (res.stdout + res.stderr).decode("utf-8")  # strict: raises on invalid UTF-8
    assert "[unsafe_path]" in text or '"unsafe_path"' in text
    assert "\\xff.bin: file name is not valid UTF-8" in text


def _pull_with_file_size_limit(lock: Path, dest: Path, endpoint: str, limit: int) -> Any:
    """``weights pull`` whose file writes fail past ``limit`` bytes (EFBIG), as on a full disk."""
    import subprocess
    import sys

    from tests.conftest import file_size_limited
    from tests.weights.cli_util import ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=endpoint, HF_HUB_DISABLE_TELEMETRY="1", PYTHONPATH=str(ROOT))
    return subprocess.run(
        file_size_limited([sys.executable, "-m", "weights.cli", "pull", "--lock", str(lock),
                           "--into", str(dest), "-q"], limit),
        capture_output=True, text=True, env=env, timeout=120, check=False)


def test_pull_local_write_failure_is_an_io_error_not_a_hub_error(
    hub_server: HubServer, tmp_path: Path,
) -> None:
    from weights.hub import HubClient
    from weights.pin import pin

    lock = tmp_path / "weights.lock"
    pin(HubClient(hub_server.url), lock, SHARDED)
    dest = tmp_path / "model"
    res = _pull_with_file_size_limit(lock, dest, hub_server.url, 20_000)
    assert res.returncode == 2, res.stderr
    assert "weights: error [io_error]" in res.stderr and "hub_error" not in res.stderr
    assert "cannot write" in res.stderr and ".part" in res.stderr
    assert "File too large" in res.stderr
    assert "hint: free space" in res.stderr
    # The failed file is not visible; the next run resumes from the kept .part.
    assert not (dest / "model-00001-of-00002.safetensors").exists()
    again = run_cli(["pull", "--lock", str(lock), "--into", str(dest), "-q"],
                    endpoint=hub_server.url)
    assert again.returncode == 0, again.stderr


def test_pull_refuses_up_front_when_the_destination_lacks_space(
    hub_server: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import shutil

    from weights.errors import StorageError
    from weights.hub import HubClient
    from weights.pin import pin
    from weights.pull import pull_entry

    lock = tmp_path / "weights.lock"
    pin(HubClient(hub_server.url), lock, SHARDED)
    entry = Lockfile.load(lock).entry(SHARDED)
    real = shutil.disk_usage

    def tiny(path: Any) -> Any:
        return real(path)._replace(free=1000)

    monkeypatch.setattr("weights.pull.shutil.disk_usage", tiny)
    n = len(hub_server.hub.requests)
    with pytest.raises(StorageError, match=rf"needs {entry.total_bytes} bytes, 1000 free"):
        pull_entry(HubClient(hub_server.url), entry, into=tmp_path / "model")
    assert len(hub_server.hub.requests) == n  # refused before any download
    assert not (tmp_path / "model").exists()


@pytest.mark.parametrize("repo_id", ["../evil", "org/na me", "a/b/c", "x/", ""])
def test_pin_refuses_a_malformed_repo_id_before_any_request(tmp_path: Path, repo_id: str) -> None:
    lock = tmp_path / "weights.lock"
    res = run_cli(["pin", repo_id, "--lock", str(lock)])  # endpoint unroutable: never reached
    assert res.returncode == 2, res.stderr
    assert f"weights: error [weights_error]: {repo_id!r} is not a repository id" in res.stderr
    assert "Traceback" not in res.stderr and "cannot reach" not in res.stderr
    assert not lock.exists()


@pytest.mark.parametrize("value", ["0", "-80", "nan", "inf", "0GB"])
def test_size_refuses_a_gpu_memory_that_is_not_a_positive_size(
    tmp_path: Path, value: str
) -> None:
    model = _model(tmp_path / "m", "x")
    res = run_cli(["size", str(model), "--gpu-mem", value])
    assert res.returncode == 2, res.stderr
    assert f"weights: error [sizing_error]: bad memory size {value!r}" in res.stderr
    assert "Traceback" not in res.stderr


def test_verbose_is_accepted_after_the_command_too(
    two_models: tuple[Path, Path, list[LockEntry]],
) -> None:
    plain, lock, _ = two_models
    res = run_cli(["verify", str(plain / "org/beta"), "--lock", str(lock), "-v"])
    assert res.returncode == 0, res.stderr
    bad = run_cli(["verify", str(plain / "absent"), "--lock", str(lock), "--repo", "org/beta",
                   "--verbose"])
    assert bad.returncode == 2 and "Traceback" in bad.stderr and "not a directory" in bad.stderr


def test_lockfile_and_cache_refs_are_readable_by_other_users(
    two_models: tuple[Path, Path, list[LockEntry]], tmp_path: Path,
) -> None:
    """vLLM usually runs as another user than the operator who pulled: refs/<revision> (and
    the lockfile, which is meant to be shared) follow the umask like every other file."""
    import stat

    from weights import hf_cache_paths, write_ref

    _, _, entries = two_models
    old = os.umask(0o022)
    try:
        Lockfile(tuple(entries)).save(tmp_path / "shared.lock")
        paths = hf_cache_paths(tmp_path / "cache", "org/alpha")
        write_ref(paths, "main", entries[0].commit)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "shared.lock").stat().st_mode) == 0o644
    assert stat.S_IMODE(paths.ref("main").stat().st_mode) == 0o644


def test_an_unexpected_exception_is_one_line_without_verbose(
    two_models: tuple[Path, Path, list[LockEntry]],
) -> None:
    """Defence in depth behind the fixes above: a bug still prints one line, exit 2."""
    import subprocess
    import sys

    from tests.weights.cli_util import ROOT

    plain, lock, _ = two_models
    code = ("import sys, weights.verify as v\n"
            "def boom(*a, **k): raise RuntimeError('injected')\n"
            "v.verify_tree = boom\n"
            "from weights.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    args = ["verify", str(plain / "org/beta"), "--lock", str(lock)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         env=env, timeout=60, check=False)
    assert res.returncode == 2
    assert res.stderr.startswith(
        "weights: error [internal_error]: unexpected RuntimeError: injected")
    assert "Traceback" not in res.stderr
    loud = subprocess.run([sys.executable, "-c", code, *args, "-v"], capture_output=True,
                          text=True, env=env, timeout=60, check=False)
    assert loud.returncode == 2 and "Traceback" in loud.stderr


@pytest.mark.parametrize("command", [["pull", "--into", "dest"], ["verify", "."]])
def test_a_lockfile_pinning_nothing_is_an_error_not_a_silent_success(
    tmp_path: Path, command: list[str],
) -> None:
    lock = tmp_path / "weights.lock"
    lock.write_text('{"version": 1, "models": []}\n')
    res = run_cli([*command, "--lock", str(lock)], cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert f"weights: error [lock_entry_missing]: {lock} pins no model" in res.stderr
    assert "(hint: pin one first with `weights pin REPO_ID`)" in res.stderr
    assert not (tmp_path / "dest").exists()


def test_concurrent_pulls_into_one_cache_take_turns(
    hub_server: HubServer, tmp_path: Path,
) -> None:
    """Two pulls into one cache shared `.weights-staging`: the first to finish deleted the
    other's partial files (random io_error). A pull now waits for the other one."""
    import fcntl
    import subprocess
    import sys

    from tests.weights.cli_util import ROOT
    from weights.hub import HubClient
    from weights.pin import pin

    lock = tmp_path / "weights.lock"
    pin(HubClient(hub_server.url), lock, SHARDED)
    cache = tmp_path / "cache"
    held = cache / ".locks" / "weights-pull.lock"
    held.parent.mkdir(parents=True)
    fd = os.open(held, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # "another pull" is running
    requests = len(hub_server.hub.requests)  # pin downloaded the regular files already
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=hub_server.url, HF_HUB_DISABLE_TELEMETRY="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "weights.cli", "pull", "--lock", str(lock),
                             "--cache", str(cache), "-q"], stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # blocks until the pull says it waits
        assert f"waiting for another weights pull into {cache}" in line
        assert len(hub_server.hub.requests) == requests  # nothing fetched while waiting
        assert not (cache / ".weights-staging").exists()
    finally:
        os.close(fd)  # the other pull ends
    assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    if proc.stderr is not None:
        proc.stderr.close()
    res = run_cli(["verify", str(cache), "--lock", str(lock)])
    assert res.returncode == 0, res.stderr


def test_verify_json_reports_usage_and_io_errors_as_json_too(tmp_path: Path) -> None:
    lock = tmp_path / "absent.lock"
    res = run_cli(["verify", str(tmp_path), "--lock", str(lock), "--json"])
    assert res.returncode == 2
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["error"]["code"] == "lockfile_invalid"
    assert "lockfile not found" in doc["error"]["message"]
    assert "weights: error [lockfile_invalid]" in res.stderr
