"""Benchmark: airgap pack / verify / unpack vs `openssl dgst -sha256` and `model_signing verify`.

Generates a sharded snapshot of --size-gib GiB (default 2) under a temporary directory, runs
every command once as a child process (in one run, same data, warm page cache) and prints
throughput in GiB/s, ratios, CPU cores used and each child's peak RSS (``ru_maxrss`` from
``wait4``). Everything generated is deleted afterwards.

Targets (issue 6): verify >= 0.9 x the openssl rate per core used, faster than
``model_signing verify``, peak memory < 200 MB whatever the bundle size.

    .venv/bin/python bench/airgap.py [--size-gib 2] [--shards 4] [--workers 0] [--keep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
GIB = 1024**3


@dataclass
class Run:
    name: str
    seconds: float
    cpu_seconds: float
    max_rss_mib: float
    nbytes: int

    @property
    def gib_s(self) -> float:
        return self.nbytes / GIB / self.seconds

    @property
    def cores(self) -> float:
        return self.cpu_seconds / self.seconds


def run(name: str, cmd: list[str], nbytes: int, env: dict[str, str] | None = None) -> Run:
    """Run ``cmd`` as a child; measure wall time, CPU time and peak RSS of that child alone."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}): {' '.join(cmd)}\n{stderr}")
    return Run(name, seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, nbytes)


def generate(model: Path, size: int, shards: int) -> None:
    """A sharded safetensors-like snapshot of ``size`` bytes of random data, plus small files."""
    model.mkdir(parents=True)
    block = os.urandom(16 * 1024**2)
    per = size // shards
    for i in range(shards):
        with open(model / f"model-{i + 1:05d}-of-{shards:05d}.safetensors", "wb") as fh:
            left = per
            while left:
                n = min(left, len(block))
                fh.write(block[:n])
                left -= n
                # vary the content so shards differ (content is stored once per blob)
                block = block[1:] + block[:1] if left else block
    (model / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 2}\n')
    (model / "tokenizer.json").write_text('{"version": "1.0"}\n' * 10000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gib", type=float, default=2.0, help="snapshot size in GiB")
    ap.add_argument("--shards", type=int, default=4, help="number of weight shards")
    ap.add_argument("--workers", type=int, default=0, help="airgap hashing threads (0 = cores)")
    ap.add_argument("--part-size", type=int, default=1024**3, help="bundle part size in bytes")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests" / "airgap"))
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from airgap import generate_keypair
    from airgap_helpers import lock_entry_from_dir, write_lock  # test helper: pins a local dir

    tmp = Path(tempfile.mkdtemp(prefix="airgap-bench-"))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", DO_NOT_TRACK="1",
               PYTHONPATH=str(ROOT))
    try:
        model = tmp / "model"
        size = int(args.size_gib * GIB)
        t0 = time.perf_counter()
        generate(model, size, args.shards)
        nbytes = sum(p.stat().st_size for p in model.rglob("*") if p.is_file())
        print(f"generated {nbytes / GIB:.2f} GiB in {args.shards} shards "
              f"({time.perf_counter() - t0:.1f} s) under {tmp}")
        lock = tmp / "weights.lock"
        write_lock(lock, lock_entry_from_dir(model, "bench/model"))
        generate_keypair(tmp / "key.pem")
        ec_key = ec.generate_private_key(ec.SECP256R1())
        (tmp / "ec.pem").write_bytes(ec_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        (tmp / "ec.pub.pem").write_bytes(ec_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        files = sorted(str(p) for p in model.rglob("*") if p.is_file())
        airgap = str(VENV_BIN / "airgap")
        ms = str(VENV_BIN / "model_signing")
        workers = str(args.workers)
        bundle, store = tmp / "bundle", tmp / "store"
        load_before = Path("/proc/loadavg").read_text().split()[:3]

        run("warm page cache", ["cat", *files], nbytes)  # first reads come from disk otherwise
        results = [
            run("openssl dgst -sha256", ["openssl", "dgst", "-sha256", *files], nbytes),
            run("airgap pack", [airgap, "pack", "--lock", str(lock), "--from", str(model),
                                "--out", str(bundle), "--key", str(tmp / "key.pem"),
                                "--part-size", str(args.part_size), "--quiet"], nbytes, env),
            run("airgap verify", [airgap, "verify", str(bundle), "--public-key",
                                  str(tmp / "key.pub.pem"), "--workers", workers, "--quiet"],
                nbytes, env),
            run("airgap verify --workers 1", [airgap, "verify", str(bundle), "--public-key",
                                              str(tmp / "key.pub.pem"), "--workers", "1",
                                              "--quiet"], nbytes, env),
            run("airgap unpack", [airgap, "unpack", str(bundle), "--public-key",
                                  str(tmp / "key.pub.pem"), "--into", str(store),
                                  "--workers", workers, "--quiet"], nbytes, env),
        ]
        run("model_signing sign", [ms, "sign", "key", str(model), "--signature",
                                   str(tmp / "model.sig"), "--private_key", str(tmp / "ec.pem")],
            nbytes, env)
        results.append(run("model_signing verify", [
            ms, "verify", "key", str(model), "--signature", str(tmp / "model.sig"),
            "--public_key", str(tmp / "ec.pub.pem")], nbytes, env))
        load_after = Path("/proc/loadavg").read_text().split()[:3]

        openssl = results[0]
        by_name = {r.name: r for r in results}
        print(f"\nload average before {' '.join(load_before)}, after {' '.join(load_after)}; "
              f"{os.cpu_count()} cores; data in page cache\n")
        print(f"{'command':28} {'GiB/s':>7} {'seconds':>8} {'cores':>6} {'peak RSS MiB':>13} "
              f"{'vs openssl/core':>16}")
        for r in results:
            per_core = r.gib_s / (openssl.gib_s * max(r.cores, 1.0))
            print(f"{r.name:28} {r.gib_s:7.2f} {r.seconds:8.2f} {r.cores:6.2f} "
                  f"{r.max_rss_mib:13.1f} {per_core:16.2f}")
        v = by_name["airgap verify"]
        m = by_name["model_signing verify"]
        print(f"\nairgap verify / openssl: {v.gib_s / openssl.gib_s:.2f}x wall, "
              f"{v.gib_s / (openssl.gib_s * max(v.cores, 1.0)):.2f} per core used")
        print(f"airgap verify / model_signing verify: {v.gib_s / m.gib_s:.2f}x")
        print(f"peak RSS: verify {v.max_rss_mib:.0f} MiB, unpack "
              f"{by_name['airgap unpack'].max_rss_mib:.0f} MiB, pack "
              f"{by_name['airgap pack'].max_rss_mib:.0f} MiB (target < 200 MB)")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
