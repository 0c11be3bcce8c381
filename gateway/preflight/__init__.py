"""``gateway preflight``: sovereignty pre-flight checks and a signed evidence pack.

Public API::

    report, facts = run_preflight(Inputs(...), Criteria(regions=("eu-central-1",)))
    report.exit_code, report.to_json(), report.to_markdown()
    write_pack(out_dir, report, facts, sign_key)        # in-toto Statement v1 in DSSE
    verify_pack(out_dir, public_key) -> PackReport
    gateway_status(settings, egress)                   # the admin port's GET /status source
    files = evidence_files(report, facts)              # read once, then:
    oscal.write_oscal(dir, report, files)              # OSCAL 1.2.1 (mapping.yaml as data)
    write_pack(out_dir, report, facts, sign_key, oscal_files, evidence=files)
    continuous.ContinuousPreflight / LiveChecks        # re-runs in `gateway serve`
"""

from gateway.preflight.checks import CHECKS, run_checks, run_preflight
from gateway.preflight.errors import EvidenceError, PreflightError, PreflightInputError
from gateway.preflight.evidence import PackReport, pae, verify_pack, write_pack
from gateway.preflight.inputs import Criteria, Facts, Inputs, collect
from gateway.preflight.report import CRITERIA, MANUAL_ATTESTATIONS, CheckResult, Report
from gateway.preflight.status import gateway_status

__all__ = [
    "CHECKS",
    "CRITERIA",
    "MANUAL_ATTESTATIONS",
    "CheckResult",
    "Criteria",
    "EvidenceError",
    "Facts",
    "Inputs",
    "PackReport",
    "PreflightError",
    "PreflightInputError",
    "Report",
    "collect",
    "gateway_status",
    "pae",
    "run_checks",
    "run_preflight",
    "verify_pack",
    "write_pack",
]
