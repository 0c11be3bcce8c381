"""Cost and accuracy of sensitive-data detection (policy.pii, gateway.pii.request), in one run.

1. Detection cost: :meth:`policy.pii.Detector.scan` on prompts of 1, 4 and 16 KB, without and
   with identifiers (p50 and p95 in ms, and ms per KB).
2. Added time to first token: two gateways on loopback in this process, the same config and
   policy except that one policy has a ``pii`` section, relaying to one vLLM simulator; streamed
   chat requests with a 4 KB prompt alternate between them (same client, same simulator), and
   the time to the first SSE data event is compared (p50, p95).
3. Precision and recall on the labelled set of :mod:`bench.pii_corpus` (valid and invalid check
   digits, identifiers split by spaces, hyphens and dots, decoys).
4. Context words: the detector reading them from a window around each match (the default,
   :mod:`policy.pii.context`) beside Presidio's enhancer over the whole text's words
   (``windowed_context=False``, the previous behaviour), alternating scans of the same 4 KB
   prompts (p50 each), and whether both find the same on the labelled set.
5. Request scan, whole body vs five fields: the relay's stage
   (:meth:`gateway.pii.request.PiiStage.inspect`: every member but ``model``, the duplicate-key
   check, structural rules) beside the previous selection (only ``messages``, ``prompt``,
   ``input``, ``instructions`` of the body, scanned by the same detector), alternating on the
   same bodies without identifiers (p50 in microseconds, and the ratio): a chat with a 4 KB
   prompt only; the same with 8 tools, ``response_format``, ``metadata``, ``user``, ``stop``;
   a Responses request with 8 tools and ``text.format``.

Usage::

    .venv/bin/python bench/pii.py [--requests 60] [--per-entity 100] [--context-only]
    .venv/bin/python bench/pii.py --request-scan-only
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.loopback import ThreadServer  # noqa: E402
from bench.pii_corpus import generate, score  # noqa: E402
from gateway.app import create_app  # noqa: E402
from gateway.assembly import assemble  # noqa: E402
from gateway.auth import Principal  # noqa: E402
from gateway.config.loader import parse  # noqa: E402
from gateway.egress import start_egress  # noqa: E402
from gateway.pii.request import PiiStage  # noqa: E402
from gateway.relay.records import RequestRecord  # noqa: E402
from gateway.relay.rewrite import parse_body  # noqa: E402
from policy import Policy  # noqa: E402
from policy.pii import Detector  # noqa: E402
from vllm_sim import SimConfig  # noqa: E402
from vllm_sim import create_app as create_sim  # noqa: E402

FILLER = ("The quarterly report covers 14 regions and 2024 targets; revenue grew 3.5% while "
          "costs fell. Please summarise the key risks, the open actions from meeting 7 and "
          "the next steps for the team. ")
IDS = " Customer IBAN DE89 3704 0044 0532 0130 00, mail jane.doe@example.org. "
KEY = "sg-bench-pii"


def _prompt(kb: int, with_ids: bool) -> str:
    text = (FILLER * (kb * 1024 // len(FILLER) + 1))[: kb * 1024]
    if with_ids:
        mid = len(text) // 2
        text = (text[:mid] + IDS + text[mid:])[: kb * 1024]
    return text


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def detection_cost(detector: Detector, rounds: int = 200) -> list[dict[str, Any]]:
    rows = []
    for kb in (1, 4, 16):
        for with_ids in (False, True):
            text = _prompt(kb, with_ids)
            for _ in range(10):
                detector.scan(text)
            times = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                detector.scan(text)
                times.append((time.perf_counter() - t0) * 1000.0)
            p50 = statistics.median(times)
            rows.append({"kb": kb, "identifiers": with_ids, "p50_ms": round(p50, 3),
                         "p95_ms": round(_pct(times, 0.95), 3),
                         "ms_per_kb": round(p50 / kb, 3)})
    return rows


def _gateway(tmp: Path, name: str, sim: ThreadServer, pii: bool) -> ThreadServer:
    policy = (
        "version: 1\ndata_classes: [public, personal]\ndestinations:\n"
        f"  - {{id: sim, host: 127.0.0.1, port: {sim.port}, region: eu, jurisdiction: EU, "
        "operator: bench}\n"
        "rules:\n  - {id: anyone, classes: [public, personal]}\n"
        + ("pii:\n  default_class: personal\n" if pii else ""))
    (tmp / f"{name}.yaml").write_text(policy)
    settings = parse({
        "models": [{"name": "m", "replicas": [{"url": sim.url, "destination": "sim"}]}],
        "keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
                  "models": ["m"], "data_class": "public"}],
        "health": {"active": False},
        "logging": {"access_log": False},
        "policy": {"file": f"{name}.yaml", "guard": "off"},
    })
    runtime = start_egress(settings, tmp)
    return ThreadServer(create_app(settings, assemble(settings, tmp, egress=runtime)))


def _ttft(client: httpx.Client, url: str, prompt: str) -> float:
    body = {"model": "m", "stream": True, "max_tokens": 2,
            "messages": [{"role": "user", "content": prompt}]}
    t0 = time.perf_counter()
    with client.stream("POST", url + "/v1/chat/completions", json=body,
                       headers={"authorization": f"Bearer {KEY}"}) as resp:
        resp.raise_for_status()
        ttft = None
        for line in resp.iter_lines():  # read to the end: the connection is reused
            if ttft is None and line.startswith("data:"):
                ttft = (time.perf_counter() - t0) * 1000.0
    assert ttft is not None
    return ttft


def added_ttft(requests: int) -> dict[str, Any]:
    sim = ThreadServer(create_sim(SimConfig(models=["m"])))
    with tempfile.TemporaryDirectory() as d:
        off = _gateway(Path(d), "off", sim, pii=False)
        on = _gateway(Path(d), "on", sim, pii=True)
        try:
            out: dict[str, Any] = {}
            with httpx.Client(timeout=30) as client:
                for with_ids in (False, True):
                    prompt = _prompt(4, with_ids)
                    for _ in range(5):  # warm both paths (connections, detector)
                        _ttft(client, off.url, prompt)
                        _ttft(client, on.url, prompt)
                    t_off, t_on = [], []
                    for _ in range(requests):
                        t_off.append(_ttft(client, off.url, prompt))
                        t_on.append(_ttft(client, on.url, prompt))
                    p50_off, p50_on = statistics.median(t_off), statistics.median(t_on)
                    out["with_identifiers" if with_ids else "clean"] = {
                        "off_p50_ms": round(p50_off, 3), "on_p50_ms": round(p50_on, 3),
                        "added_p50_ms": round(p50_on - p50_off, 3),
                        "off_p95_ms": round(_pct(t_off, 0.95), 3),
                        "on_p95_ms": round(_pct(t_on, 0.95), 3),
                    }
            return out
        finally:
            on.stop()
            off.stop()
            sim.stop()


def accuracy(detector: Detector, per_entity: int) -> dict[str, Any]:
    tp = fp = fn = 0
    for sample, _ in generate(per_entity):
        found = [(f.entity, f.start, f.end) for f in detector.scan(sample.text)]
        a, b, c = score(found, sample.spans)
        tp, fp, fn = tp + a, fp + b, fn + c
    return {"true_positives": tp, "false_positives": fp, "false_negatives": fn,
            "precision": round(tp / (tp + fp), 4), "recall": round(tp / (tp + fn), 4)}


def context_cost(detector: Detector, rounds: int = 400) -> dict[str, Any]:
    """p50 of scans of the 4 KB prompts, windowed context vs whole-text context, alternating."""
    whole = Detector(windowed_context=False)
    out: dict[str, Any] = {}
    for with_ids in (False, True):
        text = _prompt(4, with_ids)
        times: dict[str, list[float]] = {"windowed": [], "whole_text": []}
        for i in range(rounds + 20):
            for name, det in (("windowed", detector), ("whole_text", whole)):
                t0 = time.perf_counter()
                det.scan(text)
                if i >= 20:
                    times[name].append((time.perf_counter() - t0) * 1000.0)
        out["4kb_with_ids" if with_ids else "4kb_clean"] = {
            f"{k}_p50_ms": round(statistics.median(v), 3) for k, v in times.items()}
    out["same_findings_on_labelled_set"] = all(
        detector.scan(s.text) == whole.scan(s.text) for s, _ in generate(100))
    return out


#: The fields the stage scanned before it scanned whole bodies (for section 5).
FIVE_FIELDS = {"/v1/chat/completions": ("messages",), "/v1/responses": ("input", "instructions")}


def _tools(n: int) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {
        "name": f"tool_{i}", "description": "Looks up the order and returns its state.",
        "parameters": {"type": "object", "required": ["order"], "properties": {
            "order": {"type": "string", "description": "the order's reference"},
            "state": {"type": "string", "enum": ["open", "shipped", "closed"]}}}}}
        for i in range(n)]


def _bodies() -> dict[str, tuple[str, dict[str, Any]]]:
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": _prompt(4, False)}]
    schema = {"type": "object", "properties": {"answer": {"type": "string",
                                                          "description": "the answer"}}}
    chat = {"model": "m", "max_tokens": 16, "temperature": 0.2, "messages": messages}
    return {
        "chat_4kb": ("/v1/chat/completions", chat),
        "chat_4kb_tools": ("/v1/chat/completions", {
            **chat, "tools": _tools(8), "tool_choice": "auto", "user": "team-analytics",
            "metadata": {"project": "quarterly"}, "stop": ["END"],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "out", "schema": schema}}}),
        "responses_tools": ("/v1/responses", {
            "model": "m", "instructions": "Be brief.", "input": _prompt(4, False),
            "tools": [{"type": "function", **t["function"]} for t in _tools(8)],
            "text": {"format": {"type": "json_schema", "name": "out", "schema": schema}}}),
    }


def request_scan_cost(rounds: int = 400) -> dict[str, Any]:
    """Section 5: p50 of the stage on whole bodies vs the five-field selection, alternating."""
    pii = Policy.from_text("version: 1\ndata_classes: [public, personal]\n"
                           "pii:\n  default_class: personal\n").pii
    assert pii is not None
    stage = PiiStage(pii)
    principal = Principal("k", None, "public", frozenset({"*"}))

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, (path, body) in _bodies().items():
            raw = json.dumps(body).encode()
            times: dict[str, list[float]] = {"five_fields_us": [], "whole_body_us": []}
            for i in range(rounds + 20):
                parsed = parse_body(raw)
                t0 = time.perf_counter()
                record = RequestRecord("r", 0.0, "POST", path)
                value = {f: parsed.values[f] for f in FIVE_FIELDS[path] if f in parsed.values}
                verdict = await pii.inspect_async(value, "k", None, "public")
                record.detected(verdict.as_record())
                t1 = time.perf_counter()
                await stage.inspect(path, principal, parsed, RequestRecord("r", 0.0, "POST",
                                                                           path), {})
                t2 = time.perf_counter()
                if i >= 20:
                    times["five_fields_us"].append((t1 - t0) * 1e6)
                    times["whole_body_us"].append((t2 - t1) * 1e6)
            row = {k: round(statistics.median(v), 1) for k, v in times.items()}
            row["ratio"] = round(row["whole_body_us"] / row["five_fields_us"], 2)
            row["body_bytes"] = len(raw)
            out[name] = row
        return out

    return asyncio.run(run())


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=60, help="streamed requests per variant")
    ap.add_argument("--per-entity", type=int, default=100, help="labelled samples per entity")
    ap.add_argument("--context-only", action="store_true",
                    help="only the windowed vs whole-text context comparison")
    ap.add_argument("--request-scan-only", action="store_true",
                    help="only the whole-body vs five-field request scan comparison")
    args = ap.parse_args(argv)
    if args.request_scan_only:
        print(json.dumps({"request_scan_cost": request_scan_cost()}, indent=2))
        return 0
    t0 = time.perf_counter()
    detector = Detector()
    if args.context_only:
        print(json.dumps({"context_cost": context_cost(detector)}, indent=2))
        return 0
    result = {
        "detector_build_s": round(time.perf_counter() - t0, 2),
        "detection_cost": detection_cost(detector),
        "added_ttft_4kb": added_ttft(args.requests),
        "accuracy": accuracy(detector, args.per_entity),
        "context_cost": context_cost(detector),
        "request_scan_cost": request_scan_cost(),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
