"""Subprocess for the gateway crash test: a real gateway with the audit log, until SIGKILLed.

Usage: python _audit_gateway_proc.py CONFIG_JSON PORT
CONFIG_JSON holds {"gateway": <gateway config dict>, "env": {...}, "audit": <audit section>}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import uvicorn

from gateway.app import create_app
from gateway.audit.observer import build
from gateway.config.loader import parse


def main(config_file: Path, port: int) -> None:
    cfg = json.loads(config_file.read_text())
    settings = parse(cfg["gateway"], cfg["env"])
    observer = build(cfg["audit"])
    assert observer is not None
    app = create_app(settings, observers=[observer])
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop="asyncio",
        http="h11",
        lifespan="on",
        log_level="warning",
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
