"""Live reload of a real ``gateway serve`` process: SIGHUP (or a watched file change) applies a
new configuration without dropping a connection, or refuses it whole (logged and audited)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.conftest import default_signals, free_port
from tests.conftest import wait_until as _wait
from tests.gateway.gateway_server import connect, read_until_closed, split_response
from tests.gateway.helpers import (
    KEY_A,
    KEY_B,
    SERVED,
    Sim,
    Stream,
    audit_export,
    config,
    sha,
    start_sim,
)

KEY_C = "sg-test-key-team-c"
_ID = re.compile(rb'"id":"[^"]*"|"created":\d+')


class Served:
    """One ``gateway serve`` process with its config file, log file and audit store."""

    def __init__(self, tmp: Path, cfg: dict[str, Any],
                 while_starting: Callable[[Served], None] | None = None) -> None:
        self.port = free_port()
        cfg["listen"]["port"] = self.port
        self.path = tmp / "gateway.yaml"
        self.log = tmp / "gateway.log"
        from gateway.audit import Signer, generate_key_file, write_key_pair

        self.store = f"sqlite://{tmp / 'audit.db'}"
        key, _ = write_key_pair(Signer.generate(), tmp / "audit.key")
        cfg["audit"] = {"store": self.store, "signing_key_file": str(key),
                        "pseudonym_key_file": str(generate_key_file(tmp / "pseudonym.key"))}
        self.write(cfg)
        self.url = f"http://127.0.0.1:{self.port}"
        self.clients: list[openai.OpenAI] = []
        with self.log.open("w") as err:
            self.proc = subprocess.Popen(
                default_signals(
                    [sys.executable, "-m", "gateway.cli", "serve", "--config", str(self.path)]),
                stdout=subprocess.DEVNULL, stderr=err, text=True,
                env={**os.environ, "VLLM_KEY": "backend-key"},
            )
        if while_starting is not None:  # the file is loaded; not serving yet
            _wait(lambda: "Started server process" in self.log.read_text()
                  or self.proc.poll() is not None, 60, "the server process to start")
            while_starting(self)
        _wait(lambda: self.ready() or self.proc.poll() is not None, 60, "gateway start")
        assert self.proc.poll() is None, self.log.read_text()

    def write(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.path.write_text(yaml.safe_dump(cfg))

    def ready(self) -> bool:
        try:
            return httpx.get(self.url + "/readyz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def client(self, key: str) -> openai.OpenAI:
        client = openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=30)
        self.clients.append(client)
        return client

    def records(self, type_: str) -> list[dict[str, Any]]:
        return [r["data"] for r in audit_export(self.store) if r["type"] == type_]

    def hup_and_wait(
        self, type_: str, then: Callable[[], None] | None = None
    ) -> dict[str, Any]:
        """SIGHUP, then the new audit record of ``type_`` (reloaded or reload_refused).

        The gateway logs its one line after the record is durable: wait on the log (cheap).
        """
        needle = "reloaded " if type_ == "config.reloaded" else "refused"
        before = len(self.log_lines(needle))
        self.proc.send_signal(signal.SIGHUP)
        _wait(lambda: len(self.log_lines(needle)) > before, 30, type_)
        if then is not None:
            then()
        assert self.proc.poll() is None
        return self.records(type_)[-1]

    def log_lines(self, needle: str) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if needle in line]

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _check_config(path: Path) -> dict[str, Any]:
    res = subprocess.run([sys.executable, "-m", "gateway.cli", "check-config", str(path),
                          "--json"], capture_output=True, text=True,
                         env={**os.environ, "VLLM_KEY": "backend-key"}, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def _check_config_revision(path: Path) -> str:
    return str(_check_config(path)["revision"])


@pytest.fixture
def sims(serve_asgi: Callable[..., Any]) -> tuple[Sim, Sim]:
    # 20 ms between tokens: a 100-token stream lasts about 2 s.
    return (start_sim(serve_asgi, itl_s=0.02, tokens_per_response=1000),
            start_sim(serve_asgi, models=["new-served"]))


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def start(cfg: dict[str, Any],
              while_starting: Callable[[Served], None] | None = None) -> Served:
        srv = Served(tmp_path, cfg, while_starting)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


def test_sighup_applies_keys_models_and_replicas_while_a_stream_runs_byte_exact(
    sims: tuple[Sim, Sim], serve: Callable[[dict[str, Any]], Served], tmp_path: Path,
) -> None:
    sim_a, sim_b = sims
    gw = serve(config([sim_a.url], logging={"access_log": False, "format": "json"},
                      quotas={"keys": {"team-a": {"requests_per_minute": 1000}}}))
    first_revision = _check_config_revision(gw.path)
    stream = Stream(gw.url, max_tokens=500, model=SERVED, include_usage=True)  # about 10 s
    # The same request straight to the simulator, at the same time (not 10 s more afterwards):
    # what the relayed stream must equal.
    direct = Stream(sim_a.url, max_tokens=500, model=SERVED, include_usage=True)
    stream.start()
    direct.start()
    _wait(lambda: len(stream.events) > 3, 30, "the stream to start")

    new = json.loads(json.dumps(gw.cfg))
    new["keys"] = [new["keys"][0],  # team-b removed, team-c added with the new model
                   {"id": "team-c", "sha256": sha(KEY_C), "models": ["new-model"], "team": "c"}]
    new["models"].append({"name": "new-model", "served_model_name": "new-served",
                          "replicas": [{"url": sim_b.url}]})
    new["quotas"]["keys"]["team-c"] = {"requests_per_minute": 1}  # a limit for the new key
    new["quotas"]["keys"]["team-a"] = {"requests_per_minute": 2}  # a lowered limit, key in use
    gw.write(new)
    alive: list[bool] = []
    record = gw.hup_and_wait("config.reloaded", then=lambda: alive.append(stream.is_alive()))
    assert alive == [True]  # the reload was applied while the stream was running

    assert record["cause"] == "signal" and record["file"] == str(gw.path)
    assert record["old_revision"] == first_revision
    assert record["new_revision"] == _check_config_revision(gw.path) != first_revision
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", record["new_revision"])
    assert len(gw.log_lines("reloaded")) == 1

    stream.join(60)
    direct.join(60)
    assert stream.status == 200 and stream.events[-1] == "[DONE]"
    assert direct.status == 200 and direct.events[-1] == "[DONE]"
    # byte-exact apart from the response id and creation time the simulator draws per request
    assert _ID.sub(b"", stream.body) == _ID.sub(b"", direct.body)

    # the new key reaches the new model on the new replica; the removed key is refused
    reply = gw.client(KEY_C).chat.completions.create(
        model="new-model", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert reply.model == "new-served"
    assert sim_b.stats()["completed"] >= 1
    with pytest.raises(openai.RateLimitError):  # the new key's new limit applies
        gw.client(KEY_C).chat.completions.create(
            model="new-model", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    with pytest.raises(openai.AuthenticationError):
        gw.client(KEY_B).models.list()
    assert [m.id for m in gw.client(KEY_A).models.list().data] == ["llama-3.1-8b"]
    # the key that was admitted before the reload (its plan known) gets its lowered limit
    with pytest.raises(openai.RateLimitError):
        for _ in range(3):
            gw.client(KEY_A).with_options(max_retries=0).chat.completions.create(
                model="llama-3.1-8b", messages=[{"role": "user", "content": "hi"}],
                max_tokens=1)


def test_invalid_or_restart_only_config_is_refused_whole_and_the_running_one_keeps_serving(
    sims: tuple[Sim, Sim], serve: Callable[[dict[str, Any]], Served],
) -> None:
    sim_a, _ = sims
    gw = serve(config([sim_a.url], logging={"access_log": False, "format": "json"}))
    good = json.loads(json.dumps(gw.cfg))
    revision = _check_config_revision(gw.path)
    with_key_c = [*good["keys"], {"id": "team-c", "sha256": sha(KEY_C), "models": ["*"]}]

    bad_models = json.loads(json.dumps(good["models"]))
    bad_models[0]["replicas"][0]["url"] = "ftp://127.0.0.1:1"
    cases = [
        # not YAML at all
        ("models: [\n", "(top level): not valid YAML"),
        # a valid new key next to an invalid one: nothing of it applies
        (yaml.safe_dump({**good, "keys": [*with_key_c, {"id": "bad", "sha256": "xyz"}]}),
         "keys[3].sha256: must be 64 hex characters"),
        # a replica URL with an unknown scheme, next to the valid new key
        (yaml.safe_dump({**good, "keys": with_key_c, "models": bad_models}),
         "models[0].replicas[0].url: must be an http:// or https:// URL"),
        # keys that change only at a restart, each named
        (yaml.safe_dump({**good, "keys": with_key_c, "limits": {"max_client_connections": 7},
                         "logging": {**good["logging"], "level": "debug"}}),
         "limits.max_client_connections: cannot change while serving"),
    ]
    refused: list[dict[str, Any]] = []
    for text, problem in cases:
        gw.path.write_text(text)
        record = gw.hup_and_wait("config.reload_refused")
        refused.append(record)
        assert record["revision"] == revision and record["cause"] == "signal"
        assert any(problem in p and p.startswith(f"{gw.path}:") for p in record["problems"]), \
            record["problems"]
        # still the old configuration: the new key is unknown, the old ones work
        with pytest.raises(openai.AuthenticationError):
            gw.client(KEY_C).models.list()
        assert gw.client(KEY_A).chat.completions.create(
            model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        ).choices
    assert any("logging.level: cannot change while serving" in p
               for p in refused[-1]["problems"])
    assert len(gw.log_lines("refused")) == len(cases)  # one log line per refused reload
    assert gw.records("config.reloaded") == []


def _policy(port: int, deny_team_a: bool, extra_port: int | None = None) -> str:
    deny = "  - {id: block-team-a, effect: deny, principals: {teams: [a]}}\n"
    rules = deny if deny_team_a else ""
    dest = "  - {{id: {}, host: 127.0.0.1, port: {}, region: eu-de-1, jurisdiction: EU, " \
           "operator: acme}}\n"
    extra = dest.format("extra", extra_port) if extra_port is not None else ""
    return ("version: 1\ndata_classes: [internal]\ndestinations:\n" + dest.format("sim", port)
            + extra + f"rules:\n{rules}  - {{id: internal-anywhere, classes: [internal]}}\n")


def test_a_policy_change_applies_to_new_requests_only(
    sims: tuple[Sim, Sim], serve: Callable[[dict[str, Any]], Served], tmp_path: Path,
) -> None:
    sim_a, _ = sims
    port = int(sim_a.url.rsplit(":", 1)[1])
    policy = tmp_path / "policy.yaml"
    policy.write_text(_policy(port, deny_team_a=False))
    cfg = config([sim_a.url], logging={"access_log": False, "format": "json"},
                 policy={"file": str(policy), "guard": "off"})
    cfg["models"] = cfg["models"][:1]
    cfg["models"][0]["replicas"][0]["destination"] = "sim"
    cfg["keys"][1]["models"] = ["llama-3.1-8b"]
    admin = free_port()
    cfg["telemetry"] = {"admin": {"host": "127.0.0.1", "port": admin}}
    gw = serve(cfg)
    status = f"http://127.0.0.1:{admin}/status"
    started_with = httpx.get(status, timeout=10).json()["policy"]["revision"]
    stream = Stream(gw.url, max_tokens=300, model=SERVED, include_usage=True)  # about 6 s
    stream.start()
    _wait(lambda: len(stream.events) > 3, 30, "the stream to start")

    policy.write_text(_policy(port, deny_team_a=True))
    alive: list[bool] = []
    record = gw.hup_and_wait("config.reloaded", then=lambda: alive.append(stream.is_alive()))
    assert alive == [True]
    assert record["old_revision"] != record["new_revision"]
    now = httpx.get(status, timeout=10).json()  # what `gateway preflight` reads
    assert now["policy"]["revision"] != started_with
    assert now["policy"]["revision"] == _check_config(gw.path)["policy"]["revision"]
    with pytest.raises(openai.PermissionDeniedError) as denied:
        gw.client(KEY_A).chat.completions.create(
            model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert "block-team-a" in str(denied.value)
    assert gw.client(KEY_B).chat.completions.create(  # team-b is not denied
        model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=2).choices
    stream.join(60)  # admitted before the change: it runs to its end
    assert stream.status == 200 and stream.events[-1] == "[DONE]"
    assert not any(isinstance(e, dict) and "error" in e for e in stream.events)

    # a new policy whose destinations differ is refused (the guard checks addresses)
    policy.write_text(_policy(port, deny_team_a=False, extra_port=free_port()))
    refused = gw.hup_and_wait("config.reload_refused")
    assert any("policy.file: destinations: changed" in p for p in refused["problems"])


def test_file_watch_reloads_a_swapped_keys_file_without_a_signal(
    sims: tuple[Sim, Sim], serve: Callable[[dict[str, Any]], Served], tmp_path: Path,
) -> None:
    sim_a, _ = sims
    # As Kubernetes mounts a Secret: keys.yaml -> ..data/keys.yaml, ..data -> a dated directory.
    first, second = tmp_path / "v1", tmp_path / "v2"
    for where, keys in ((first, [KEY_A]), (second, [KEY_A, KEY_C])):
        where.mkdir()
        (where / "keys.yaml").write_text(yaml.safe_dump([
            {"id": f"k{i}", "sha256": sha(k), "models": ["*"]} for i, k in enumerate(keys)]))
    (tmp_path / "..data").symlink_to(first)
    (tmp_path / "keys.yaml").symlink_to(tmp_path / "..data" / "keys.yaml")
    cfg = config([sim_a.url], logging={"access_log": False, "format": "json"},
                 reload={"watch": True, "interval_s": 0.2})
    cfg["keys"] = []
    cfg["keys_file"] = "keys.yaml"
    gw = serve(cfg)
    with pytest.raises(openai.AuthenticationError):
        gw.client(KEY_C).models.list()

    swap = tmp_path / "..data_tmp"
    swap.symlink_to(second)
    swap.rename(tmp_path / "..data")  # atomic, as the kubelet does
    _wait(lambda: len(gw.records("config.reloaded")) == 1, 30, "the watched reload")
    assert gw.records("config.reloaded")[0]["cause"] == "watch"
    assert gw.client(KEY_C).models.list().data


def test_a_change_signalled_while_starting_is_applied_once_serving(
    sims: tuple[Sim, Sim], serve: Callable[..., Served],
) -> None:
    """A SIGHUP after the file was loaded and before the server serves neither ends the
    process nor is lost: the change it announces applies once serving (audited as a reload)."""
    sim_a, _ = sims

    def add_key_and_hup(gw: Served) -> None:
        new = json.loads(json.dumps(gw.cfg))
        new["keys"].append({"id": "team-c", "sha256": sha(KEY_C), "models": ["*"], "team": "c"})
        gw.write(new)
        gw.proc.send_signal(signal.SIGHUP)

    gw = serve(config([sim_a.url], logging={"format": "text"}), add_key_and_hup)
    _wait(lambda: bool(gw.log_lines("reloaded ")) or gw.proc.poll() is not None, 30,
          "the owed reload")
    assert gw.proc.poll() is None, gw.log.read_text()
    assert gw.records("config.reloaded")[-1]["cause"] == "signal"
    assert "llama-3.1-8b" in [m.id for m in gw.client(KEY_C).models.list().data]


def test_a_watched_file_changed_while_starting_is_applied_once_serving(
    sims: tuple[Sim, Sim], serve: Callable[..., Served], tmp_path: Path,
) -> None:
    """With ``reload.watch``, a keys file swapped after the config was loaded and before the
    watch started is still seen: the first round compares the running revision, not the files'
    content at that moment."""
    sim_a, _ = sims
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump([]))
    cfg = config([sim_a.url], logging={"format": "text"}, reload={"watch": True, "interval_s": 0.2})
    cfg["keys_file"] = str(keys)

    def swap_keys(gw: Served) -> None:
        keys.write_text(yaml.safe_dump(
            [{"id": "team-c", "sha256": sha(KEY_C), "models": ["*"], "team": "c"}]))

    gw = serve(cfg, swap_keys)
    _wait(lambda: bool(gw.log_lines("reloaded ")), 30, "the watch to apply the swapped file")
    assert gw.records("config.reloaded")[-1]["cause"] == "watch"
    assert "llama-3.1-8b" in [m.id for m in gw.client(KEY_C).models.list().data]


def _chunked_status(port: int, size: int) -> int:
    """Status of a chunked POST whose one chunk announces ``size`` bytes and never sends them
    (a refusal is at once; a wait for the bytes would run into the 60 s body timeout)."""
    with connect(port) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer "
                     + KEY_A.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n" % size)
        data, closed = read_until_closed(sock, timeout_s=3)
    return split_response(data)[0] if closed else 0


def test_a_reloaded_max_body_bytes_applies_to_chunked_bodies_in_the_server(
    sims: tuple[Sim, Sim], serve: Callable[[dict[str, Any]], Served],
) -> None:
    sim_a, _ = sims
    cfg = config([sim_a.url], limits={"max_body_bytes": 4000, "client_body_timeout_s": 60})
    gw = serve(cfg)
    assert _chunked_status(gw.port, 3000) == 0  # within the limit: the server waits for it
    cfg["limits"]["max_body_bytes"] = 2000
    gw.write(cfg)
    gw.hup_and_wait("config.reloaded")
    assert _chunked_status(gw.port, 3000) == 413
    assert _chunked_status(gw.port, 1500) == 0
