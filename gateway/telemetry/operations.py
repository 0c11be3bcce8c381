"""``gen_ai.operation.name`` of a request path, shared by the spans and the metrics.

The names are those of the OpenTelemetry GenAI semantic conventions
(https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/). A leaf module: both
:mod:`gateway.telemetry.tracing` and :mod:`gateway.telemetry.metrics` import it.
"""

from __future__ import annotations

__all__ = ["operation_name"]

_OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "chat",
}


def operation_name(path: str) -> str:
    """``gen_ai.operation.name`` of a request path (``chat``, ``text_completion``, ...).

    ``/v1/models/<id>`` is ``models`` (the id, which may contain ``/``, is not an operation).
    """
    if path.startswith("/v1/models"):
        return "models"
    return _OPERATIONS.get(path) or path.rsplit("/", 1)[-1]
