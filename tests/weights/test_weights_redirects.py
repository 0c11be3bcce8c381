"""The hub's redirects are followed only to allowed hosts, and never from https to http.

The emulated hub answers a download of an LFS file with ``302`` to a second server (its
"CDN", serving the same repositories with its own request log), as the Hub redirects to its
content hosts. A redirect to a host the operator did not allow, or from https to plain http,
is refused before a byte is requested there, naming the host and the setting.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.test_gw_tls import _write_pki
from tests.hub_emulator import Hub, create_hub_app
from tests.hub_fixtures import HUB_TOKEN, SHARDED, HubServer
from tests.weights.cli_util import run_cli
from weights import Lockfile, WeightsError, verify_tree
from weights.errors import RedirectRefusedError
from weights.hub import HubClient
from weights.pin import pin
from weights.pull import pull_entry
from weights.redirects import RedirectPolicy

NOW = datetime(2026, 11, 30, 4, 0, 0, tzinfo=UTC)


def _cdn(hub: Hub, serve: Callable[..., Any], **tls: str) -> tuple[Hub, int]:
    """A second server for the same repositories, with its own request log."""
    cdn = Hub(tokens=())
    cdn.repos = hub.repos
    return cdn, serve(create_hub_app(cdn), **tls).port


def _pinned(endpoint: str, tmp_path: Path, repo_id: str) -> Path:
    lock = tmp_path / "weights.lock"
    pin(HubClient(endpoint), lock, repo_id, now=NOW)
    return lock


def _lfs_gets(hub: Hub) -> list[str]:
    return [r.path for r in hub.downloads(".safetensors")]


def test_redirect_to_an_allowed_host_is_followed_without_the_token(
    hub_server: HubServer, serve_asgi: Callable[..., Any], tmp_path: Path
) -> None:
    cdn, port = _cdn(hub_server.hub, serve_asgi)
    hub_server.hub.redirect_to = f"http://localhost:{port}"  # another host name: not the endpoint
    entry = Lockfile.load(_pinned(hub_server.url, tmp_path, SHARDED)).entry(SHARDED)
    dest = tmp_path / "model"
    pinned = len(hub_server.hub.requests)
    pull_entry(HubClient(hub_server.url, token=HUB_TOKEN, redirect_hosts=["localhost"]), entry,
               into=dest)
    assert verify_tree(dest, entry).ok
    assert sorted(_lfs_gets(cdn)) == sorted(
        f"/{SHARDED}/resolve/{entry.commit}/{f.path}" for f in entry.files
        if f.path.endswith(".safetensors"))
    assert cdn.requests and not any(r.authorized for r in cdn.requests)  # token stayed home
    assert all(r.authorized for r in hub_server.hub.requests[pinned:])


def test_redirect_to_a_host_not_allowed_is_refused_naming_host_and_setting(
    hub_server: HubServer, serve_asgi: Callable[..., Any], tmp_path: Path
) -> None:
    cdn, port = _cdn(hub_server.hub, serve_asgi)
    hub_server.hub.redirect_to = f"http://localhost:{port}"
    entry = Lockfile.load(_pinned(hub_server.url, tmp_path, SHARDED)).entry(SHARDED)
    dest = tmp_path / "model"
    with pytest.raises(RedirectRefusedError) as info:
        pull_entry(HubClient(hub_server.url), entry, into=dest)  # defaults: *.hf.co only
    err = info.value
    assert err.code == "redirect_refused" and err.host == "localhost"
    assert "host 'localhost'" in err.message and "allowed: the endpoint's host, *.hf.co" in (
        err.message)
    assert err.hint is not None and "--redirect-host (WEIGHTS_REDIRECT_HOSTS)" in err.hint
    assert cdn.requests == []  # not a byte asked of the host that was not allowed
    assert not dest.exists() or not any(p.is_file() for p in dest.rglob("*.safetensors"))


def test_pull_cli_takes_the_allowed_hosts_from_option_or_environment(
    hub_server: HubServer, serve_asgi: Callable[..., Any], tmp_path: Path
) -> None:
    cdn, port = _cdn(hub_server.hub, serve_asgi)
    hub_server.hub.redirect_to = f"http://localhost:{port}"
    lock = _pinned(hub_server.url, tmp_path, SHARDED)
    refused = run_cli(["pull", "--lock", str(lock), "--into", str(tmp_path / "a"), "-q"],
                      endpoint=hub_server.url)
    assert refused.returncode == 2, refused.stderr
    assert "redirect_refused" in refused.stderr and "'localhost'" in refused.stderr
    assert "--redirect-host (WEIGHTS_REDIRECT_HOSTS)" in refused.stderr
    assert cdn.requests == []
    by_env = run_cli(["pull", "--lock", str(lock), "--into", str(tmp_path / "b"), "-q"],
                     endpoint=hub_server.url,
                     extra_env={"WEIGHTS_REDIRECT_HOSTS": "cdn.example.org localhost"})
    assert by_env.returncode == 0, by_env.stderr
    by_option = run_cli(["pull", "--lock", str(lock), "--into", str(tmp_path / "c"), "-q",
                         "--redirect-host", "localhost"], endpoint=hub_server.url)
    assert by_option.returncode == 0, by_option.stderr
    assert len(_lfs_gets(cdn)) == 4  # two shards, two successful pulls


@pytest.fixture
def tls_hub(hub: Hub, serve_asgi: Callable[..., Any], tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict[str, str]]:
    """The hub over https on 127.0.0.1 (its CA trusted through SSL_CERT_FILE)."""
    ca, cert, key = _write_pki(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    tls = {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
    return f"https://127.0.0.1:{serve_asgi(create_hub_app(hub), **tls).port}", tls


def test_https_hub_redirecting_to_plain_http_is_refused(
    hub: Hub, tls_hub: tuple[str, dict[str, str]], serve_asgi: Callable[..., Any],
    tmp_path: Path
) -> None:
    endpoint, _ = tls_hub
    cdn, port = _cdn(hub, serve_asgi)
    hub.redirect_to = f"http://127.0.0.1:{port}"  # the endpoint's own host, but plain http
    entry = Lockfile.load(_pinned(endpoint, tmp_path, SHARDED)).entry(SHARDED)
    with pytest.raises(RedirectRefusedError, match="from https to plain http"):
        pull_entry(HubClient(endpoint, redirect_hosts=["127.0.0.1"]), entry,
                   into=tmp_path / "model")
    assert cdn.requests == []


def test_https_hub_redirecting_to_https_is_followed(
    hub: Hub, tls_hub: tuple[str, dict[str, str]], serve_asgi: Callable[..., Any],
    tmp_path: Path
) -> None:
    endpoint, tls = tls_hub
    cdn, port = _cdn(hub, serve_asgi, **tls)
    hub.redirect_to = f"https://127.0.0.1:{port}"
    entry = Lockfile.load(_pinned(endpoint, tmp_path, SHARDED)).entry(SHARDED)
    dest = tmp_path / "model"
    pull_entry(HubClient(endpoint), entry, into=dest)
    assert verify_tree(dest, entry).ok and len(_lfs_gets(cdn)) == 2


@pytest.mark.parametrize(("target", "allowed"), [
    ("https://cdn-lfs.hf.co/x", True),
    ("https://cas-bridge.xethub.hf.co/x?sig=1", True),
    ("https://CDN-LFS.HF.CO./x", True),
    ("https://hub.example:8443/other", True),  # the endpoint's host, any port
    ("https://hf.co/x", False),  # *.hf.co is under hf.co, not hf.co itself
    ("https://evilhf.co/x", False),
    ("https://cdn-lfs.hf.co.evil.example/x", False),
    ("http://cdn-lfs.hf.co/x", False),  # downgrade
    ("ftp://cdn-lfs.hf.co/x", False),
    ("file:///etc/passwd", False),
])
def test_policy_defaults(target: str, allowed: bool) -> None:
    policy = RedirectPolicy.of("https://hub.example", None)
    if allowed:
        policy.check("https://hub.example/r/resolve/c/f", target)
    else:
        with pytest.raises(RedirectRefusedError):
            policy.check("https://hub.example/r/resolve/c/f", target)


def test_refusal_never_shows_the_signed_query() -> None:
    with pytest.raises(RedirectRefusedError) as info:
        RedirectPolicy.of("https://hub.example", None).check(
            "https://hub.example/f", "https://user:pw@cdn.other.example/f?X-Amz-Signature=s3cr3t")
    assert "s3cr3t" not in info.value.message and "pw" not in info.value.message
    assert "'cdn.other.example'" in info.value.message


@pytest.mark.parametrize("pattern", ["https://cdn.example", "cdn.example:443", "*", "*.",
                                     "cdn.*.example", "cdn.example/path", ""])
def test_malformed_redirect_host_is_refused(pattern: str) -> None:
    with pytest.raises(WeightsError, match="must be a host name"):
        HubClient("https://hub.example", redirect_hosts=[pattern])


def test_a_rerun_after_a_refused_redirect_resumes_and_does_not_call_the_run_interrupted(
    hub_server: HubServer, serve_asgi: Callable[..., Any], tmp_path: Path
) -> None:
    """The files a refused run staged are resumed by the rerun that allows the host; the
    rerun says they were left by a run that did not finish (it was refused, not killed)."""
    _, port = _cdn(hub_server.hub, serve_asgi)
    hub_server.hub.redirect_to = f"http://localhost:{port}"
    lock = _pinned(hub_server.url, tmp_path, SHARDED)
    args = ["pull", "--lock", str(lock), "--into", str(tmp_path / "m"), "-q"]
    refused = run_cli(args, endpoint=hub_server.url)
    assert refused.returncode == 2, refused.stderr
    rerun = run_cli([*args, "--redirect-host", "localhost"], endpoint=hub_server.url)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{SHARDED}: resumed " in rerun.stderr, rerun.stderr
    assert "file(s) left by an earlier run that did not finish" in rerun.stderr, rerun.stderr
    assert "interrupted earlier run" not in rerun.stderr, rerun.stderr
