"""The Containerfile is checked statically: pinned bases, non-root, locked install, no curl|sh."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import sg_helm as h
from containerfile_check import check, instructions

RECIPE = (h.REPO / "Containerfile").read_text(encoding="utf-8")


def test_containerfile_passes_every_rule() -> None:
    assert check(RECIPE) == []


def test_copied_sources_and_lock_files_exist() -> None:
    for word, rest in instructions(RECIPE):
        if word == "COPY" and "--from=" not in rest:
            for src in rest.split()[:-1]:
                assert (h.REPO / src).exists(), f"COPY source {src} missing"
    req = (h.REPO / "tools" / "uv-requirements.txt").read_text(encoding="utf-8")
    assert "--hash=sha256:" in req


def test_build_context_excludes_local_state_and_secrets() -> None:
    for name in (".containerignore", ".dockerignore"):
        patterns = (h.REPO / name).read_text(encoding="utf-8").split()
        for must in (".git", ".venv", ".tools", "**/*.pem"):
            assert must in patterns, f"{name} lacks {must}"


def _mutate(old: str, new: str, count: int = 0) -> str:
    assert re.search(old, RECIPE, flags=re.M), old
    return re.sub(old, new, RECIPE, count=count, flags=re.M)


@pytest.mark.parametrize(("mutated", "problem"), [
    (_mutate(r"python3-debian12:nonroot@sha256:[0-9a-f]{64}", "python3-debian12:nonroot"),
     "is not pinned by sha256 digest"),
    (_mutate(r"^USER 10001:10001$", "USER root"), "is not a numeric UID >= 10000"),
    (_mutate(r"^USER 10001:10001$", "USER 0"), "is not a numeric UID >= 10000"),
    (_mutate(r"^USER 10001:10001$\n", ""), "the final stage sets no USER"),
    (_mutate(r" --frozen", ""), "`uv sync` without --frozen"),
    (_mutate(r" --no-dev", ""), "`uv sync` without --no-dev"),
    (_mutate(r"--require-hashes -r tools/uv-requirements.txt", "uv"),
     "pip install without --require-hashes"),
    (_mutate(r"^EXPOSE", "RUN curl -fsSL https://example.invalid/i.sh | sh\nEXPOSE"),
     "the final stage runs commands"),
    (_mutate(r"^COPY gateway", "RUN curl -fsSL https://example.invalid/i.sh | bash\nCOPY gateway"),
     "pipes a download into a shell"),
    (_mutate(r"^COPY gateway", "RUN /opt/uv/bin/uv pip install requests\nCOPY gateway"),
     "uv installs outside the lock"),
    (_mutate(r"^COPY gateway", "ADD https://example.invalid/x.tgz /x\nCOPY gateway"),
     "ADD of a URL"),
    (_mutate(r"HF_HUB_OFFLINE=1", "HF_HUB_OFFLINE=0"), "does not set HF_HUB_OFFLINE=1"),
    (_mutate(r"^FROM \$\{BUILD_IMAGE\} AS build$", "FROM ${RUNTIME_IMAGE} AS build"), None),
])
def test_checker_catches_each_violation(mutated: str, problem: str | None) -> None:
    problems = check(mutated)
    if problem is None:  # a harmless change stays accepted
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


def test_console_script_launchers_match_pyproject(tmp_path: Path) -> None:
    """Run the launcher-writing RUN step with /app moved to tmp and check what it writes."""
    import subprocess
    import tomllib

    (step,) = [rest for word, rest in instructions(RECIPE)
               if word == "RUN" and "/app/bin" in rest]
    subprocess.run(["sh", "-c", step.replace("/app/bin", str(tmp_path / "bin"))], check=True)
    scripts = tomllib.loads((h.REPO / "pyproject.toml").read_text(encoding="utf-8"))[
        "project"]["scripts"]
    written = sorted(p.name for p in (tmp_path / "bin").iterdir())
    assert written == sorted(s for s in scripts if s != "vllm-sim")  # no simulator in the image
    for name in written:
        text = (tmp_path / "bin" / name).read_text(encoding="utf-8")
        assert text.startswith("#!/app/.venv/bin/python\n")
        module, func = scripts[name].split(":")
        assert f"from {module} import {func}\n" in text
        compile(text, name, "exec")
        assert (h.REPO / module.replace(".", "/")).with_suffix(".py").exists() or (
            h.REPO / module.replace(".", "/") / "__init__.py").exists()
    assert 'ENTRYPOINT ["/app/bin/gateway"]' in RECIPE
