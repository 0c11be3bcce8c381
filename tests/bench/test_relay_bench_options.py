"""``bench/relay.py``'s options: ``--variant``, ``--source``, ``--replica-ms`` and their output.

Nothing is timed: the flags are parsed, the informative service-time reading is rendered from
given figures, and a variant with ``--source`` is started (no load sent) to show that its
gateway process really runs the other directory's code.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.bench.scripts import bench_module

relay = bench_module("relay")
report = bench_module("relay_report")
procs = bench_module("relay_procs")
harness = bench_module("relay_harness")

ROOT = Path(__file__).resolve().parents[2]


def _checkout(tmp: Path) -> Path:
    """A copy of this checkout's packages whose ``gateway`` records each importing process."""
    for pkg in ("gateway", "policy", "weights", "airgap"):
        shutil.copytree(ROOT / pkg, tmp / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    with (tmp / "gateway" / "__init__.py").open("a") as f:
        f.write("\nimport os as _os\n"
                "with open(_os.path.join(_os.path.dirname(__file__), 'imported-by'), 'a') as _f:\n"
                "    _f.write(f'{_os.getpid()}\\n')\n")
    return tmp


def test_variants_default_to_one_gateway_and_keep_their_order() -> None:
    assert relay.parse_args([]).variant_specs == [("gateway", None)]
    args = relay.parse_args(["--variant", "audit=cfg/audit.yaml", "--variant", "off=default",
                             "--variant", "self=direct"])
    assert args.variant_specs == [("audit", "cfg/audit.yaml"), ("off", None),
                                  ("self", "direct")]
    assert args.sources == {}


@pytest.mark.parametrize(("argv", "message"), [
    (["--variant", "audit"], "must be NAME=CONFIG_YAML"),
    (["--variant", "=cfg.yaml"], "must be NAME=CONFIG_YAML"),
    (["--variant", "audit="], "must be NAME=CONFIG_YAML"),
    (["--variant", "a=x.yaml", "--variant", "a=y.yaml"], "the name 'a' is taken"),
    (["--variant", "direct=x.yaml"], "the name 'direct' is taken"),
    (["--variant", "nginx=default"], "the name 'nginx' is taken"),
    (["--replica-ms", "-1"], "--replica-ms must be >= 0"),
])
def test_malformed_variants_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        relay.parse_args(argv)


def test_source_must_be_a_checkout_and_name_a_gateway_variant(tmp_path: Path) -> None:
    (tmp_path / "gateway").mkdir()
    args = relay.parse_args(["--variant", "old=default", "--variant", "new=default",
                             "--source", f"old={tmp_path}"])
    assert args.sources == {"old": str(tmp_path.resolve())}
    with pytest.raises(SystemExit, match="with DIR/gateway"):
        relay.parse_args(["--source", f"gateway={tmp_path / 'gateway'}"])
    with pytest.raises(SystemExit, match="no gateway variant named 'olf'"):
        relay.parse_args(["--variant", "old=default", "--source", f"olf={tmp_path}"])
    with pytest.raises(SystemExit, match="no gateway variant named 'self'"):
        relay.parse_args(["--variant", "self=direct", "--source", f"self={tmp_path}"])


def test_a_variant_with_a_source_runs_that_checkouts_gateway(tmp_path: Path) -> None:
    other = _checkout(tmp_path / "other")
    args = relay.parse_args(["--variant", "old=default", "--variant", "new=default",
                             "--source", f"old={other}", "--nginx", "off"])
    variants = [(name, procs.load_variant(path)) for name, path in args.variant_specs]
    targets = [relay.Target("direct", "127.0.0.1", 0, "m", None)]
    targets += [relay.Target(name, "127.0.0.1", 0, "m", procs.BENCH_KEY) for name, _ in variants]
    workdir = tmp_path / "work"
    workdir.mkdir()
    # No phase: the backend and both gateways start (each waited for until it answers its
    # health check) and stop; nothing is measured.
    asyncio.run(relay.run_unpaced(harness.Harness(), [], variants, targets, args, workdir))
    by_name = {t.name: t for t in targets}
    old_pid, new_pid = by_name["old"].proc.proc.pid, by_name["new"].proc.proc.pid
    assert old_pid != new_pid
    imported_by = {int(line) for line in (other / "gateway" / "imported-by").read_text().split()}
    assert old_pid in imported_by
    assert new_pid not in imported_by


def _target(name: str, **results: float) -> Any:
    t = relay.Target(name, "127.0.0.1", 0, "m", None)
    t.results.update(results)
    return t


def _figures(with_service_time: bool) -> list[Any]:
    base = {"direct": dict(c1_p50_ms=0.01, c1_p99_ms=0.01, c32_p50_ms=0.17, c32_p99_ms=1.52,
                           burst_ttft_p50_ms=2.4),
            "gateway": dict(c1_p50_ms=0.17, c1_p99_ms=0.30, c32_p50_ms=4.05, c32_p99_ms=6.35,
                            burst_ttft_p50_ms=49.0),
            "nginx": dict(c1_p50_ms=0.02, c1_p99_ms=0.05, c32_p50_ms=0.38, c32_p99_ms=3.10,
                          burst_ttft_p50_ms=5.6)}
    service = {"direct": (21.0, 21.7, 22.7), "gateway": (22.0, 26.47, 66.6),
               "nginx": (21.0, 24.96, 23.6)}
    out = []
    for name, res in base.items():
        if with_service_time:
            p50, p99, burst = service[name]
            res = {**res, "svc_c32_p50_ms": p50, "svc_c32_p99_ms": p99,
                   "svc_burst_ttft_p50_ms": burst}
        out.append(_target(name, **res))
    return out


def test_c32_and_burst_are_checked_against_the_replica_service_time() -> None:
    args = argparse.Namespace(replica_ms=20.0)
    plain = report.render(_figures(False), args).splitlines()
    both = report.render(_figures(True), args).splitlines()
    assert both[:len(plain)] == plain  # the reading without service time is unchanged
    checks = [ln for ln in plain if ln.startswith("gateway: added c1 p99")]
    assert checks == ["gateway: added c1 p99 0.29 ms < 1.0 ms: PASS"]
    # The zero-service ratios are informative, no longer target checks.
    assert ("gateway: c32 p99 4.18x direct; burst TTFT p50 20.42x direct (informative, against "
            "a backend without service time)") in plain
    extra = both[len(plain):]
    label = "against a replica with 20 ms service time"
    assert any(label in ln and "the target check" in ln for ln in extra)
    assert (f"gateway: c32 p99 1.22x direct <= 1.25: PASS; burst TTFT p50 2.93x direct <= 1.5: "
            f"FAIL ({label})") in extra
    # nginx is the comparison, never checked.
    assert f"nginx: c32 p99 1.15x direct; burst TTFT p50 1.04x direct ({label})" in extra


def test_at_another_service_time_the_ratios_are_not_checked() -> None:
    lines = report.render_replica(_figures(True), 5.0)
    assert any("informative: the targets are set at --replica-ms 20" in ln for ln in lines)
    assert not any("PASS" in ln or "FAIL" in ln for ln in lines)
    assert "gateway: c32 p99 1.22x direct; burst TTFT p50 2.93x direct (against a replica with " \
           "5 ms service time)" in lines


def test_the_service_time_is_a_flag_with_a_default_and_can_be_left_out() -> None:
    assert relay.parse_args([]).replica_ms == 20.0
    assert relay.parse_args(["--replica-ms", "0"]).replica_ms == 0.0
    assert report.render_replica(_figures(False), 20.0) == []
