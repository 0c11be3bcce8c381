"""Static checks of a Containerfile (no container engine runs on the CI machines).

``check(text) -> list[str]`` returns one message per violated rule, empty when the recipe is
acceptable:

* every ``FROM`` names an image pinned by ``@sha256:<64 hex>`` (ARG defaults are resolved);
* multi-stage, and the final stage runs no ``RUN`` (distroless: no shell) and sets a numeric
  non-root ``USER`` (UID >= 10000);
* dependencies come from the lock: ``uv sync`` with ``--frozen`` and ``--no-dev``; every
  ``pip install`` uses ``--require-hashes``; uv is installed from tools/uv-requirements.txt;
* nothing is piped from the network into a shell, and no ``ADD`` of a URL;
* the final stage sets the hidden-egress switches.
"""

from __future__ import annotations

import re
import shlex

EGRESS_SWITCHES = {
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
}
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
_PIPE_TO_SHELL = re.compile(r"\b(curl|wget)\b[^|;&]*\|\s*(sudo\s+)?(ba|z|da)?sh\b")


def instructions(text: str) -> list[tuple[str, str]]:
    """Parse into (INSTRUCTION, arguments) pairs, joining continuation lines."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def _env_pairs(args: str) -> dict[str, str]:
    pairs = {}
    for token in shlex.split(args):
        if "=" in token:
            key, _, value = token.partition("=")
            pairs[key] = value
    return pairs


def check(text: str) -> list[str]:
    """Return the rules ``text`` violates (empty list: acceptable)."""
    problems: list[str] = []
    ins = instructions(text)
    args: dict[str, str] = {}
    stages: list[list[tuple[str, str]]] = []
    for word, rest in ins:
        if word == "ARG" and not stages:
            key, _, value = rest.partition("=")
            args[key] = value
        elif word == "FROM":
            image = rest.split()[0]
            ref = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], ""), image)
            if not _DIGEST.search(ref):
                problems.append(f"base image {ref or image!r} is not pinned by sha256 digest")
            stages.append([])
        elif stages:
            stages[-1].append((word, rest))
        else:
            problems.append(f"{word} before the first FROM")
    if len(stages) < 2:
        problems.append("not a multi-stage build")
    if not stages:
        return problems
    final = stages[-1]
    if any(word == "RUN" for word, _ in final):
        problems.append("the final stage runs commands (it must not need a shell)")
    users = [rest for word, rest in final if word == "USER"]
    if not users:
        problems.append("the final stage sets no USER")
    else:
        uid = users[-1].split(":")[0]
        if not uid.isdigit() or int(uid) < 10000:
            problems.append(f"final USER {users[-1]!r} is not a numeric UID >= 10000")
    env: dict[str, str] = {}
    for word, rest in final:
        if word == "ENV":
            env.update(_env_pairs(rest))
    for key, value in EGRESS_SWITCHES.items():
        if env.get(key) != value:
            problems.append(f"the final stage does not set {key}={value}")
    runs = [rest for stage in stages for word, rest in stage if word == "RUN"]
    syncs = [r for r in runs if re.search(r"\buv\s+sync\b", r)]
    if not syncs:
        problems.append("no `uv sync` from uv.lock")
    for r in syncs:
        for flag in ("--frozen", "--no-dev"):
            if flag not in r.split():
                problems.append(f"`uv sync` without {flag}")
    for r in runs:
        for cmd in re.split(r"&&|;", r):
            if re.search(r"\bpip3?\s+install\b", cmd) and "--require-hashes" not in cmd:
                problems.append(f"pip install without --require-hashes: {cmd.strip()}")
            if re.search(r"\buv\s+(pip\s+)?(install|add)\b", cmd):
                problems.append(f"uv installs outside the lock: {cmd.strip()}")
        if _PIPE_TO_SHELL.search(r):
            problems.append(f"pipes a download into a shell: {r}")
    if not any("tools/uv-requirements.txt" in r and "--require-hashes" in r for r in runs):
        problems.append("uv is not installed from tools/uv-requirements.txt with hashes")
    for stage in stages:
        for word, rest in stage:
            if word == "ADD" and re.search(r"https?://", rest):
                problems.append(f"ADD of a URL: {rest}")
    return problems
