"""Errors of the vLLM simulator and their OpenAI-shaped JSON bodies.

Exception tree::

    SimError                  (code "sim_error", 500)
    ├── BadRequest            (code "bad_request", 400: invalid value or prompt too long)
    │   └── InvalidBody       (code "invalid_body", 400: not JSON, missing or mistyped field)
    ├── ModelNotFound         (code "model_not_found", 404: unknown ``model``)
    ├── RouteNotFound         (code "route_not_found", 404: unknown path)
    └── MethodNotAllowed      (code "method_not_allowed", 405)

The body follows vLLM's OpenAI-compatible server (checked against vLLM 0.32): ``{"error":
{"message", "type", "param", "code"}}`` where ``type`` is the error class name
(``BadRequestError``, ``NotFoundError``; ``Bad Request`` for schema validation errors) and
``code`` is the HTTP status as an integer.
"""

from __future__ import annotations

import json


class SimError(Exception):
    """Base of the simulator's errors; ``code`` is a stable machine code."""

    code = "sim_error"
    status = 500
    error_type = "InternalServerError"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def body(self) -> bytes:
        """Return the OpenAI-shaped JSON error body (UTF-8 bytes)."""
        return error_body(self.message, self.error_type, self.status, self.param)


class BadRequest(SimError):
    """The request is malformed or exceeds the model's limits (HTTP 400)."""

    code = "bad_request"
    status = 400
    error_type = "BadRequestError"


class InvalidBody(BadRequest):
    """The body is not JSON or fails schema validation (vLLM's type ``Bad Request``)."""

    code = "invalid_body"
    error_type = "Bad Request"


class ModelNotFound(SimError):
    """The request names a model the simulator does not serve (HTTP 404)."""

    code = "model_not_found"
    status = 404
    error_type = "NotFoundError"

    def __init__(self, model: str, served: list[str]) -> None:
        aliases = ", ".join(served)
        super().__init__(
            f"The model `{model}` does not exist. Valid aliases: {aliases}.", param="model"
        )


class RouteNotFound(SimError):
    """No endpoint at this path (HTTP 404)."""

    code = "route_not_found"
    status = 404
    error_type = "NotFoundError"


class MethodNotAllowed(SimError):
    """The path exists but not for this HTTP method (HTTP 405)."""

    code = "method_not_allowed"
    status = 405
    error_type = "MethodNotAllowed"


def error_body(message: str, error_type: str, status: int, param: str | None = None) -> bytes:
    """Serialise an OpenAI-shaped error object.

    Args:
        message: Human-readable message.
        error_type: Error class name, e.g. ``BadRequestError``.
        status: HTTP status, repeated as the integer ``code`` like vLLM does.
        param: The request field at fault, if known.

    Returns:
        ``{"error": {"message", "type", "param", "code"}}`` as UTF-8 JSON bytes.
    """
    err = {"message": message, "type": error_type, "param": param, "code": status}
    return json.dumps({"error": err}, ensure_ascii=False).encode()
