"""Policy documents shared by the policy tests (imported as ``policy_testdata``)."""

from __future__ import annotations

import textwrap

BASE = textwrap.dedent(
    """\
    version: 1
    data_classes: [public, internal, confidential, personal]
    classification:
      header: x-data-classification
      grants:
        - id: research-may-lower
          teams: [research]
          lower: true
          classes: [internal]
        - id: anyone-raise
          keys: [k-raise]
          raise: true
    destinations:
      - id: vllm-eu-a
        url: http://10.20.0.11:8000
        region: eu-de-1
        jurisdiction: EU
        operator: acme
        tags: [no-retention, no-training]
      - id: vllm-eu-b
        host: 10.20.0.12
        port: 8000
        region: eu-fr-1
        jurisdiction: EU
        operator: acme
        tags: [no-training]
      - id: provider-us
        url: https://api.provider.example/v1
        region: us-east-1
        jurisdiction: non-EU
        operator: provider-inc
      - id: audit-db
        url: postgresql://10.30.0.5:5432/audit
        region: eu-de-1
        jurisdiction: EU
        operator: acme
        purpose: audit
    rules:
      - id: block-contractor
        effect: deny
        principals: {teams: [contractors]}
      - id: sensitive-eu-no-retention
        classes: [confidential, personal]
        constraints:
          jurisdiction: EU
          require_tags: [no-retention]
      - id: internal-eu
        classes: [internal]
        constraints: {jurisdiction: EU}
      - id: public-anywhere
        classes: [public]
    """
)
