"""A/B of the normalised view (policy.pii.normalize) against a baseline revision, in one run.

The baseline detector is the ``policy/pii`` package of ``--baseline`` (a git revision),
extracted into a temporary directory and imported under another name, so both detectors run in
this process on the same inputs:

1. Precision and recall on the labelled set of :mod:`bench.pii_corpus` as it is (ASCII), and on
   the same set with each planted identifier rewritten with look-alikes (its spaces as U+00A0,
   U+202F or a tab, its digits fullwidth or Arabic-Indic, a zero-width space after its second
   character), the spans moved accordingly; the decoys are kept.
2. CPU per scan (``time.process_time``, microseconds, p50 of alternating runs) of a chat
   request with a 4 KB ASCII prompt, the same with a French paragraph (U+202F, U+00A0, accents),
   and one with an IBAN and a card grouped by U+00A0.

Usage::

    .venv/bin/python bench/pii_lookalikes.py [--baseline main] [--per-entity 100] [--rounds 40]
"""

from __future__ import annotations

import argparse
import importlib
import io
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.pii_corpus import Sample, generate, score  # noqa: E402
from policy.pii import Detector  # noqa: E402

FILLER = ("The quarterly report covers 14 regions and 2024 targets; revenue grew 3.5% while "
          "costs fell. Please summarise the key risks and the next steps for the team. ")
FRENCH = ("Le rapport trimestriel couvre 14\u202frégions ; le chiffre d\u2019affaires a "
          "progressé de 3,5\u00a0% et s\u2019élève à 12\u202f450\u202f000\u00a0€. ")
IDS = (" Customer IBAN DE89\u00a03704\u00a00044\u00a00532\u00a00130\u00a000, card "
       "4111\u00a01111\u00a01111\u00a01111. ")

_REWRITES: list[Callable[[str], str]] = [
    lambda s: s.replace(" ", "\u00a0"),
    lambda s: s.replace(" ", "\u202f"),
    lambda s: s.replace(" ", "\t"),
    lambda s: s.translate({ord(d): 0xFF10 + int(d) for d in "0123456789"}),
    lambda s: s.translate({ord(d): 0x660 + int(d) for d in "0123456789"}),
    lambda s: s[:2] + "\u200b" + s[2:],
]


def _baseline(rev: str, tmp: Path) -> Any:
    """The baseline's ``Detector`` class (``policy/pii`` of ``rev``, imported as ``basepii``)."""
    blob = subprocess.run(["git", "archive", rev, "policy/pii"], cwd=HERE.parent, check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(tmp, filter="data")
    pkg = tmp / "basepii"
    (tmp / "policy" / "pii").rename(pkg)
    (pkg / "__init__.py").write_text("")  # its own imports policy.errors (not needed here)
    sys.path.insert(0, str(tmp))
    return importlib.import_module("basepii.engine").Detector


def _lookalike(samples: Iterator[tuple[Sample, bool]], seed: int = 7) -> Iterator[Sample]:
    rng = random.Random(seed)  # noqa: S311 - reproducible, not secrets
    for sample, _ in samples:
        if not sample.spans:
            yield sample
            continue
        [(entity, start, end)] = sample.spans
        written = rng.choice(_REWRITES)(sample.text[start:end])
        text = sample.text[:start] + written + sample.text[end:]
        yield Sample(text, ((entity, start, start + len(written)),))


def _accuracy(detector: Any, samples: list[Sample]) -> dict[str, float]:
    tp = fp = fn = 0
    for s in samples:
        found = [(f.entity, f.start, f.end) for f in detector.scan(s.text)]
        a, b, c = score(found, s.spans)
        tp, fp, fn = tp + a, fp + b, fn + c
    return {"tp": tp, "fp": fp, "fn": fn, "precision": round(tp / max(1, tp + fp), 4),
            "recall": round(tp / max(1, tp + fn), 4)}


def _body(prompt: str) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 64, "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": prompt}]}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="main", help="git revision of the baseline")
    ap.add_argument("--per-entity", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        detectors = {"baseline": _baseline(args.baseline, Path(tmp))(), "normalised": Detector()}
        ascii_set = [s for s, _ in generate(args.per_entity)]
        look_set = list(_lookalike(generate(args.per_entity)))
        for name, d in detectors.items():
            print(f"{name:>10}  labelled set (ASCII):      {_accuracy(d, ascii_set)}")
            print(f"{name:>10}  labelled set (look-alike): {_accuracy(d, look_set)}")
        bodies = {"4 KB ASCII": _body((FILLER * 30)[:4096]),
                  "4 KB French (U+202F)": _body((FRENCH * 30)[:4096]),
                  "NBSP-grouped ids": _body(FILLER + IDS)}
        for label, body in bodies.items():
            times: dict[str, list[float]] = {n: [] for n in detectors}
            for _ in range(args.rounds):
                for name, d in detectors.items():
                    t0 = time.process_time()
                    for _ in range(5):
                        d.scan(body)
                    times[name].append((time.process_time() - t0) / 5 * 1e6)
            p50 = {n: statistics.median(v) for n, v in times.items()}
            print(f"CPU per scan, {label}: baseline {p50['baseline']:.0f} us, normalised "
                  f"{p50['normalised']:.0f} us (x{p50['normalised'] / p50['baseline']:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
