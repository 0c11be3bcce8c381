"""Logging set-up for entry points (library modules only call ``logging.getLogger``), and the
``logging:`` section of the gateway config (:class:`LoggingSettings`).

Production format: JSON lines on stderr. Access lines (logger ``gateway.access``) carry the
fields of :class:`gateway.relay.records.RequestRecord` that are safe to log: never prompts,
completions or keys.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Literal

from pydantic import Field

from gateway.config.base import FrozenSection

__all__ = ["JsonFormatter", "LoggingSettings", "configure_logging"]


class LoggingSettings(FrozenSection):
    """The ``logging:`` section of the gateway config: process logging.

    Attributes:
        level: Root log level.
        access_log: Write access lines (logger ``gateway.access``).
        format: ``json`` (one object per line) or ``text``.
        refused_lines_per_client: Lines of their own per client network and interval for
            requests refused before any principal was known (:class:`gateway.access.AccessLog`);
            the rest are counted into ``refused_summary`` lines.
        refused_interval_s: That interval, seconds (summaries are written at its end).
    """

    level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = True
    format: Literal["json", "text"] = "json"
    refused_lines_per_client: int = Field(default=10, ge=0)
    refused_interval_s: float = Field(default=10.0, gt=0, le=3600)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (RFC 3339 UTC), ``level``, ``logger``, ``msg``."""

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record`` as one JSON line."""
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out: dict[str, Any] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        access = getattr(record, "access", None)
        if isinstance(access, dict):
            out["type"] = "access"
            out.update(access)
        else:
            out["msg"] = record.getMessage()
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, separators=(",", ":"), default=str)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        access = getattr(record, "access", None)
        if isinstance(access, dict):
            record.msg = " ".join(f"{k}={v}" for k, v in access.items() if v is not None)
            record.args = None
        return super().format(record)


def configure_logging(settings: LoggingSettings) -> None:
    """Route the root logger to stderr in the configured format and level."""
    handler = logging.StreamHandler(sys.stderr)
    if settings.format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(_TextFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.level.upper())
    logging.getLogger("gateway.access").disabled = not settings.access_log
