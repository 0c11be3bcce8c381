"""Each config section lives with the feature that reads it; the root model only composes them
(issue 29).

:mod:`gateway.config.settings` imports every section module while it is itself still being
defined, so no section module, nor its package's ``__init__``, may import the root model back
at import time. ``tests/test_import_circles.py`` sees the modules' own imports but not the
implied import of a package's ``__init__``; a fresh interpreter that imports the root model
first sees both.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest

import gateway.telemetry
from gateway.config.settings import GatewaySettings

ROOT = Path(__file__).resolve().parents[2]


def _section_classes() -> dict[str, type]:
    """``field name -> section model class`` of every field of the root model."""
    out: dict[str, type] = {}
    for name, field in GatewaySettings.model_fields.items():
        tp: object = field.annotation
        while typing.get_origin(tp) in (list, typing.Union, types.UnionType):
            (tp,) = [a for a in typing.get_args(tp) if a is not type(None)]
        assert isinstance(tp, type), name
        out[name] = tp
    return out


def test_no_section_is_defined_in_the_root_model() -> None:
    sections = _section_classes()
    assert {"listen", "models", "keys", "telemetry", "policy"} <= set(sections)
    inside = sorted(name for name, cls in sections.items()
                    if cls.__module__ == "gateway.config.settings")
    assert inside == []


def test_the_root_model_imports_first_in_a_fresh_interpreter() -> None:
    code = ("import json, sys\n"
            "import gateway.config.loader\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    modules = set(json.loads(run.stdout))
    assert "gateway.config.settings" in modules  # the probe saw the real import
    assert {cls.__module__ for cls in _section_classes().values()} <= modules
    # Loading a config does not import the telemetry service (nor the OpenTelemetry SDK).
    assert "gateway.telemetry.service" not in modules
    assert "opentelemetry.sdk.trace" not in modules


def test_the_telemetry_package_still_exports_its_service() -> None:
    from gateway.telemetry import (
        Telemetry,
        build_telemetry,
        check_telemetry,
        prometheus_name,
        service,
    )

    assert (Telemetry, build_telemetry, check_telemetry) == (
        service.Telemetry, service.build_telemetry, service.check_telemetry)
    assert prometheus_name.__module__ == "gateway.telemetry.prometheus"
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = gateway.telemetry.no_such_name
