"""docs/operator-guide.md, run as printed.

Every ``sh`` block of the guide, in order, in one ``bash -euo pipefail`` run from the checkout
with ``HOME`` in a temporary directory; the model directory the guide works on is a stand-in
(the real Llama 3.1 8B ``config.json`` shape from tests/weights/configs and a small
safetensors file). ``console`` blocks (vLLM on a GPU server, ``helm install`` into a cluster,
the audit log of a running gateway) are the guide's own statement of what this does not run.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gateway.audit import AuditLog, load_signer, open_store

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "operator-guide.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", GUIDE.read_text(), re.S | re.M)


def test_the_guide_covers_the_first_day_in_order() -> None:
    script = "\n".join(_blocks("sh"))
    order = ["weights plan", "weights lock", "weights sign", "airgap pack", "airgap verify",
             "airgap unpack", "gateway audit keygen", "gateway keys new", "helm\" template",
             "gateway preflight"]
    positions = [script.index(step) for step in order]
    assert positions == sorted(positions), order


def test_the_guide_says_how_to_install_what_it_uses() -> None:
    """A newcomer on a fresh clone has no .venv/ and no .tools/bin/helm: the guide installs
    both with targets that exist (``make -n`` resolves them without running anything), and
    says where ``model/`` comes from before the first command reads it."""
    consoles = "\n".join(_blocks("console"))
    for target in ("install-runtime", "helm"):
        assert f"make {target}" in consoles, target
        dry = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True,
                             timeout=60, check=False)
        assert dry.returncode == 0, dry.stderr
    text = GUIDE.read_text()
    assert text.index("in `model/`") < text.index("weights plan model/config.json")


def _run_guide(tmp_path: Path, edits: dict[str, str] | None = None) -> tuple[Path, str]:
    """Every ``sh`` block, in order, in one ``bash -euo pipefail`` run: the site directory and
    standard output. ``edits`` maps a line of shell to the first block containing a string
    it is run just before (what the reader types between two blocks, such as an edit)."""
    helm = ROOT / ".tools" / "bin" / "helm"
    if not helm.is_file():
        pytest.fail(".tools/bin/helm is missing: run `make tools` (CI does)")
    site = tmp_path / "sg-site"
    (site / "model").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "weights" / "configs" / "llama-3.1-8b.json",
                site / "model" / "config.json")
    (site / "model" / "model.safetensors").write_bytes(os.urandom(200_000))
    blocks = _blocks("sh")
    for line, before in (edits or {}).items():
        at = next(i for i, block in enumerate(blocks) if before in block)
        blocks.insert(at, line + "\n")
    script = "set -euo pipefail\n" + "\n".join(blocks)
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    env.pop("SG", None)
    run = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return site, run.stdout


@pytest.fixture(scope="module")
def guide_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The guide run as printed: the site directory and standard output."""
    return _run_guide(tmp_path_factory.mktemp("guide"))


def test_the_guide_runs_as_printed(guide_run: tuple[Path, str]) -> None:
    site, stdout = guide_run
    assert "What to run: vllm serve MODEL" in stdout
    assert "PASS: " in stdout  # the pre-flight
    assert re.search(r"PASS +weights\.locked-signed", stdout), stdout[-3000:]
    assert (site / "model.sig").is_file() and (site / "hf-cache").is_dir()
    assert not list(ROOT.glob("*.key")) and not (ROOT / "bundle").exists()


def test_a_replica_address_is_changed_in_one_file(tmp_path: Path) -> None:
    """The reader points ``vllm-eu-1`` at their own server by editing the policy, as step 7
    says, the one file where the address is written: the rendered config and the gateway's
    egress NetworkPolicy both carry the new address, and the pre-flight passes. The guide
    rendered the chart from the checkout's example policy (nothing to edit) and the example
    values' copy of its addresses: an edited copy left the NetworkPolicy on 10.0.0.11 and
    the pre-flight failed ``k8s.default-deny``."""
    edit = "sed -i 's#http://10.0.0.11:8000#http://10.0.0.99:8000#' policy.yaml"
    site, stdout = _run_guide(tmp_path, {edit: 'helm" template'})
    manifests = (site / "manifests.yaml").read_text()
    assert "http://10.0.0.99:8000" in manifests and "10.0.0.99/32" in manifests
    assert "10.0.0.11" not in manifests
    assert re.search(r"PASS +k8s\.default-deny", stdout), stdout[-3000:]


def test_the_install_and_audit_steps_use_only_what_the_guide_made(
        guide_run: tuple[Path, str]) -> None:
    """A newcomer types the ``console`` blocks on the same machine: every local file they name
    (``--from-file``, ``--set-file``, ``--config``, ``--public-key``, ``-f``) was made by an earlier
    ``sh`` block; every Secret the example values name is created before ``helm install``;
    the install mounts the audit public key that NOTES' verify command reads; and ``helm`` and
    ``kubectl`` are on the ``PATH`` the guide sets."""
    site, _ = guide_run
    text = GUIDE.read_text()
    consoles = "\n".join(_blocks("console"))
    named = re.findall(r"--from-file=[\w.-]+=(\S+)|--set-file [\w.]+=(\S+)"
                       r"|--config (\S+)|--public-key (\S+)|-f (\S+)", consoles)
    local = [f for group in named for f in group
             if f and f != "-" and not f.startswith(("$", "/", '"'))]
    assert local, "the console blocks name no local file"
    missing = [f for f in local if not (site / f).exists()]
    assert not missing, f"named by a console block, made by no sh block: {missing}"
    values = (ROOT / "examples" / "values-own-dc.yaml").read_text()
    install = text.index("helm install")
    for secret in re.findall(r"existingSecret:\s*(\S+)", values):
        assert re.search(rf"create secret generic {secret}\b", text[:install]), secret
    assert "audit.publicKey=" in text[install:text.index("```", install)]
    setup = _blocks("sh")[0]
    assert re.search(r'export PATH="[^"]*\$SG/\.tools/bin', setup), setup


def test_vllm_is_started_with_the_plans_arguments(guide_run: tuple[Path, str]) -> None:
    """Step 6 said ``plan.txt`` has the arguments but printed ``--tensor-parallel-size 1``
    while the plan of step 1 (8 B model, eight H100) says 8. The ``vllm serve`` line takes the
    plan's ``What to run`` arguments: its substitution, run on the plan the guide made, gives
    them all."""
    site, _ = guide_run
    step = next(b for b in _blocks("console") if "vllm serve" in b)
    assert "--tensor-parallel-size" not in step, "hard-coded, not the plan's"
    substitution = re.search(r"\$\((sed [^)]*plan\.txt)\)", step)
    assert substitution, step
    args = subprocess.run(["bash", "-c", substitution.group(1)], cwd=site, capture_output=True,
                          text=True, timeout=60, check=True).stdout.split()
    planned = (site / "plan.txt").read_text().split("What to run: vllm serve MODEL ")[1]
    assert args == planned.split("\n")[0].split()
    assert args[:2] == ["--tensor-parallel-size", "8"], args


def test_a_replaced_keys_secret_reaches_the_pods(guide_run: tuple[Path, str]) -> None:
    """Step 8 replaced the keys Secret and said the pods "reload or roll": with the example
    values (``gateway.reload.mode`` rollout, the chart's default) they do neither, since the
    checksum annotations cover only what helm renders, and the gateway does not watch its
    files. The step restarts the Deployment that the guide's own render names."""
    site, _ = guide_run
    chart = yaml.safe_load((ROOT / "helm" / "sovereign-gateway" / "values.yaml").read_text())
    example = yaml.safe_load((ROOT / "examples" / "values-own-dc.yaml").read_text())
    mode = {**chart["gateway"]["reload"],
            **((example.get("gateway") or {}).get("reload") or {})}["mode"]
    step = next(b for b in _blocks("console") if "kubectl apply" in b and "sg-api-keys" in b)
    if mode == "live":
        return
    restart = re.search(r"kubectl -n (\S+) rollout restart deployment/(\S+)", step)
    assert restart, step
    assert step.index("kubectl apply") < restart.start()
    deployments = [d["metadata"]["name"] for d in
                   yaml.safe_load_all((site / "manifests.yaml").read_text())
                   if d and d.get("kind") == "Deployment"]
    assert restart.group(2) in deployments, deployments
    install = next(b for b in _blocks("console") if "helm install" in b)
    assert f"-n {restart.group(1)}" in install


def test_the_independent_audit_check_runs_off_the_cluster(guide_run: tuple[Path, str],
                                                           tmp_path: Path) -> None:
    """Step 9's check off the cluster: ``gateway audit export --format ai-act`` (what the pod
    runs; here on a log signed with the key of step 5, the ``kubectl exec`` prefix left out)
    and ``gateway audit verify-export`` as printed in the site directory. It said only "copy
    the exported checkpoints out and verify them", with no command that does it."""
    site, _ = guide_run
    db = tmp_path / "audit.db"

    async def write_log() -> None:
        log = AuditLog(open_store(f"sqlite:///{db}"), load_signer(site / "audit-signing.key"),
                       replica_id="gw-0")
        await log.start()
        await log.append({"type": "request.started", "request_id": "r1", "model": "m"})
        await log.close()

    asyncio.run(write_log())
    step = next(b for b in _blocks("console") if "verify-export" in b)
    export, verify = (" ".join(c.split()) for c in step.replace("\\\n", " ").splitlines())
    export = export.split(" -- ", 1)[1].replace(
        "sqlite:///var/lib/sovereign-gateway/audit/audit.db", f"sqlite:///{db}")
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"}
    for command in (export, verify):
        run = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=site, env=env,
                             capture_output=True, text=True, timeout=120, check=False)
        assert run.returncode == 0, (command, run.stdout, run.stderr)
    assert run.stdout.startswith("OK: "), run.stdout


def test_the_vllm_key_is_written_private(guide_run: tuple[Path, str]) -> None:
    """Step 5 wrote the vLLM credential with ``> vllm-key``: mode 0644, readable by every user
    of the machine. Written under ``umask 077`` it is 0600, as ``keygen`` writes its keys."""
    site, _ = guide_run
    for name in ("vllm-key", "audit-signing.key", "audit-pseudonym.key"):
        assert (site / name).stat().st_mode & 0o777 == 0o600, name


def test_the_audit_verify_step_is_the_one_the_chart_notes_print() -> None:
    """Step 9's ``gateway audit verify`` takes the flags NOTES.txt prints for the example values
    (SQLite store, checkpoints on by default and not turned off there): ``--store``,
    ``--checkpoints`` and ``--public-key`` with the same paths. It left out ``--checkpoints``."""
    notes = (ROOT / "helm" / "sovereign-gateway" / "templates" / "NOTES.txt").read_text()
    sqlite = notes[notes.index('eq .Values.audit.store.type "sqlite"'):notes.index("{{- else }}")]
    flags = dict(re.findall(r"(--store|--checkpoints|--public-key) (/?[\w:/.-]+)", sqlite))
    assert set(flags) == {"--store", "--checkpoints", "--public-key"}, flags

    chart = yaml.safe_load((ROOT / "helm" / "sovereign-gateway" / "values.yaml").read_text())
    example = yaml.safe_load((ROOT / "examples" / "values-own-dc.yaml").read_text())
    store = {**chart["audit"]["store"], **(example.get("audit") or {}).get("store", {})}
    checkpoints = {**chart["audit"]["checkpoints"],
                   **(example.get("audit") or {}).get("checkpoints", {})}
    assert store["type"] == "sqlite" and checkpoints["enabled"] is True
    step = next(b for b in _blocks("console") if "gateway audit verify" in b)
    for flag, value in flags.items():
        assert f"{flag} {value}" in step, (flag, value, step)
