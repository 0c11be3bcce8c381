"""Serialisation policy: pickle-based weights are refused by default and, with --allow-pickle,
accepted only when the allowlist scanner finds a plain tensor state dict.

The attack shapes are generated (tests/weights/pickle_samples.py) and shown to be real by
unpickling them in a child process, which then leaves a marker file."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.hub_emulator import Blob
from tests.hub_fixtures import MINILM, HubServer
from tests.weights import pickle_samples as S
from tests.weights.cli_util import run_cli
from weights import Lockfile
from weights.errors import UnsafeSerialisationError
from weights.format_scan import inspect_file
from weights.hub import HubClient
from weights.pickle_scan import ALLOWED_GLOBALS, scan_pickle_bytes
from weights.pin import pin
from weights.pull import pull_entry
from weights.serialisation import SCANNER, SerialisationPolicy, check_format

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
ALLOW = SerialisationPolicy(allow_pickle=True)


def _attacks(marker: Path) -> dict[str, tuple[bytes, str]]:
    """name -> (file bytes, the global the scanner must name)."""
    torch_zip_attack = S.torch_zip(S.reduce_command(marker, 2))
    return {
        **{f"reduce_p{p}.pkl": (S.reduce_command(marker, p), "posix.system") for p in range(6)},
        "logging_chain.pkl": (S.innocuous_module_chain(marker), "logging.os.system"),
        "timeit_p0.pkl": (S.timeit_global(marker), "timeit.timeit"),
        "appended.bin": (S.appended(S.state_dict(2), S.reduce_command(marker, 2)), "posix.system"),
        "reduce_in_zip.pt": (torch_zip_attack, "posix.system"),
        "nested3.pt": (S.nested_zip(S.torch_zip(S.innocuous_module_chain(marker)), 3),
                       "logging.os.system"),
        "renamed.safetensors": (S.reduce_command(marker, 4), "posix.system"),
        "pickle_as_json.json": (S.timeit_global(marker), "timeit.timeit"),
        "zip_member_not_pkl.pt": (S.torch_zip(b"", extra={"archive/extra": S.reduce_command(
            marker, 3)}), "posix.system"),
    }


@pytest.mark.parametrize("protocol", range(6))
def test_plain_state_dicts_of_every_protocol_are_safe(protocol: int) -> None:
    v = scan_pickle_bytes(S.state_dict(protocol))
    assert v.safe, v.findings
    assert set(v.globals) <= ALLOWED_GLOBALS and "collections.OrderedDict" in v.globals


def test_hand_built_torch_checkpoint_is_safe_and_names_its_rebuild_functions(
    tmp_path: Path,
) -> None:
    f = tmp_path / "pytorch_model.bin"
    f.write_bytes(S.torch_zip(S.torch_state_dict_pickle()))
    kind, verdict = inspect_file(f, f.name)
    assert kind == "pickle" and verdict is not None and verdict.safe
    assert verdict.globals == ("collections.OrderedDict", "torch.FloatStorage",
                               "torch._utils._rebuild_tensor_v2")
    accepted = check_format(f, "acme/m:pytorch_model.bin", ALLOW)
    assert accepted.scan == (f"{SCANNER}: safe (globals: collections.OrderedDict, "
                             "torch.FloatStorage, torch._utils._rebuild_tensor_v2)")


def test_every_attack_shape_is_flagged_with_the_callable_it_imports(tmp_path: Path) -> None:
    for name, (data, bad) in _attacks(tmp_path / "marker").items():
        f = tmp_path / name
        f.write_bytes(data)
        kind, verdict = inspect_file(f, name)
        assert kind == "pickle", name
        assert verdict is not None and not verdict.safe, name
        assert any(bad in x for x in verdict.findings), (name, verdict.findings)
        with pytest.raises(UnsafeSerialisationError, match="pickle refused by") as exc:
            check_format(f, f"acme/m:{name}", ALLOW)
        assert exc.value.path == f"acme/m:{name}"


@pytest.mark.parametrize("shape", ["reduce_p0.pkl", "reduce_p5.pkl", "logging_chain.pkl",
                                   "timeit_p0.pkl", "appended.bin"])
def test_attack_shapes_really_run_a_command_when_unpickled(tmp_path: Path, shape: str) -> None:
    marker = tmp_path / "marker"
    f = tmp_path / shape
    f.write_bytes(_attacks(marker)[shape][0])
    S.run_in_child(f)
    assert marker.exists(), f"{shape} did not run its command: the sample is not an attack"


def test_default_policy_refuses_by_name_and_by_content_in_one_line(tmp_path: Path) -> None:
    for name, data in (("pytorch_model.bin", S.torch_zip(S.torch_state_dict_pickle())),
                       ("model.safetensors", S.state_dict(4)),  # a renamed pickle
                       ("weights.ckpt", b"not a pickle at all\n")):
        f = tmp_path / name
        f.write_bytes(data)
        with pytest.raises(UnsafeSerialisationError) as exc:
            check_format(f, f"acme/m:{name}", SerialisationPolicy())
        msg = str(exc.value)
        assert msg.startswith(f"acme/m:{name}: pickle-based file refused") and "\n" not in msg
        assert "--allow-pickle" in msg
    # A pickle-named file that is no pickle stays refused with the switch (fail closed).
    with pytest.raises(UnsafeSerialisationError, match="neither a pickle"):
        check_format(tmp_path / "weights.ckpt", "acme/m:weights.ckpt", ALLOW)


def test_real_minilm_snapshot_passes_the_default_policy(minilm_snapshot: Path) -> None:
    kinds = {p.relative_to(minilm_snapshot).as_posix():
             check_format(p, p.name, SerialisationPolicy()).format
             for p in minilm_snapshot.rglob("*") if p.is_file()}
    assert kinds["model.safetensors"] == "safetensors"
    assert {k for k, v in kinds.items() if v != "data"} == {"model.safetensors"}


def _hub_with_pickle(hub_server: HubServer, data: bytes) -> str:
    repo_id = "acme/legacy-bert"
    repo = hub_server.hub.add_repo(repo_id)
    repo.commit({"config.json": Blob(b'{"model_type": "bert"}\n'),
                 "pytorch_model.bin": Blob(data)}, message="torch checkpoint")
    return repo_id


def test_pin_refuses_pickle_before_any_download(hub_server: HubServer, tmp_path: Path) -> None:
    repo_id = _hub_with_pickle(hub_server, S.torch_zip(S.torch_state_dict_pickle()))
    lock = tmp_path / "weights.lock"
    r = run_cli(["pin", repo_id, "--lock", str(lock)], endpoint=hub_server.url)
    assert r.returncode == 1, r.stderr
    first = r.stderr.strip().splitlines()[0]
    assert f"{repo_id}:pytorch_model.bin: pickle-based file refused" in first
    assert "--allow-pickle" in first
    assert not lock.exists()
    assert not [q for q in hub_server.hub.requests if "/resolve/" in q.path]


def test_pull_scans_the_downloaded_pickle_and_keeps_nothing_unsafe(
    hub_server: HubServer, tmp_path: Path
) -> None:
    repo_id = _hub_with_pickle(hub_server, S.torch_zip(S.reduce_command(tmp_path / "m", 2)))
    lock = tmp_path / "weights.lock"
    pin(HubClient(hub_server.url), lock, repo_id, now=NOW, policy=ALLOW)  # names only
    entry = Lockfile.load(lock).entry(repo_id)
    dest = tmp_path / "model"
    with pytest.raises(UnsafeSerialisationError, match="--allow-pickle"):
        pull_entry(HubClient(hub_server.url), entry, into=dest)  # default: refused by name
    assert not [q for q in hub_server.hub.requests if "pytorch_model.bin" in q.path]
    with pytest.raises(UnsafeSerialisationError, match=r"posix\.system"):
        pull_entry(HubClient(hub_server.url), entry, into=dest, policy=ALLOW)
    assert not (dest / "pytorch_model.bin").exists()
    staged = [p for p in tmp_path.rglob("*") if p.is_file() and p.stat().st_size > 1000]
    assert staged == [], staged


def test_pull_accepts_a_safe_state_dict_with_the_switch(hub_server: HubServer,
                                                        tmp_path: Path) -> None:
    repo_id = _hub_with_pickle(hub_server, S.torch_zip(S.torch_state_dict_pickle()))
    lock = tmp_path / "weights.lock"
    pin(HubClient(hub_server.url), lock, repo_id, now=NOW, policy=ALLOW)
    entry = Lockfile.load(lock).entry(repo_id)
    r = run_cli(["pull", "--lock", str(lock), "--into", str(tmp_path / "m"), "-q",
                 "--allow-pickle"], endpoint=hub_server.url)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "m" / "pytorch_model.bin").stat().st_size == entry.file(
        "pytorch_model.bin").size


def test_minilm_pins_unchanged_under_the_default_policy(hub_server: HubServer,
                                                        tmp_path: Path) -> None:
    lock = tmp_path / "weights.lock"
    pin(HubClient(hub_server.url), lock, MINILM, now=NOW)
    assert all(f.scan is None for f in Lockfile.load(lock).entry(MINILM).files)
    assert '"scan"' not in lock.read_text()


def test_random_binary_data_is_never_taken_for_a_pickle(tmp_path: Path) -> None:
    """A weight tensor's bytes are random: about one random file in 1,400 parsed as a complete
    one-value pickle (``N.`` is one), and the default policy refused it. 20,000 seeded random
    buffers, and the shapes that used to pass, are data now."""
    import io
    import random

    from weights.pickle_scan import is_pickle

    rng = random.Random(20261201)  # noqa: S311 -- reproducible test data, not a secret
    found = [b[:8] for b in (rng.randbytes(256) for _ in range(20_000))
             if is_pickle(io.BytesIO(b), len(b))]
    assert found == []
    for head in (b"N.", b"K\x07.", b"]q\x00.", b"Gm\x1b\xe7\xad\x9d}\xa5d]\x93\x1a"):
        data = head + rng.randbytes(4000)
        assert not is_pickle(io.BytesIO(data), len(data)), head
        f = tmp_path / "weights.dat"
        f.write_bytes(data)
        assert inspect_file(f, "acme/m:weights.dat") == ("data", None)


@pytest.mark.parametrize("tail", [b"\xff" * 16, b"0000.", b""])
def test_a_command_that_runs_before_the_stream_breaks_is_refused_under_a_data_name(
    tmp_path: Path, tail: bytes,
) -> None:
    """``pickle.load`` runs ``REDUCE`` before it meets an invalid byte, a stack underflow or the
    end of the file: such a stream is a pickle whatever follows, and under a name that says
    nothing of pickles (``.dat``) it is found by content."""
    marker = tmp_path / "marker"
    command = S.reduce_command(marker, 0)
    assert command.endswith(b".")
    f = tmp_path / "weights.dat"
    f.write_bytes(command[:-1] + tail)
    S.run_in_child(f)
    assert marker.exists()  # the command ran although the stream is broken
    with pytest.raises(UnsafeSerialisationError, match="pickle-based file refused"):
        check_format(f, "acme/m:weights.dat", SerialisationPolicy())


def test_an_inert_pickle_in_front_of_a_malicious_one_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "weights.dat"
    f.write_bytes(b"N." + S.reduce_command(tmp_path / "marker", 0))
    with pytest.raises(UnsafeSerialisationError, match="pickle-based file refused"):
        check_format(f, "acme/m:weights.dat", SerialisationPolicy())
