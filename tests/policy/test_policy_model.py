"""The policy loader: validation errors name file, line and key; revision is canonical."""

from __future__ import annotations

from pathlib import Path

import pytest
from policy_testdata import BASE

from policy import Policy, PolicyFileError


def _err(text: str, name: str = "p.yaml") -> PolicyFileError:
    with pytest.raises(PolicyFileError) as info:
        Policy.from_text(text, name)
    assert info.value.code == "invalid_policy"
    return info.value


def test_base_policy_loads(policy: Policy) -> None:
    assert policy.classes == ("public", "internal", "confidential", "personal")
    a = policy.destination("vllm-eu-a").endpoint
    assert str(a.network) == "10.20.0.11/32" and a.ports == {8000} and a.hostname is None
    us = policy.destination("provider-us").endpoint
    assert us.hostname == "api.provider.example" and us.ports == {443}
    assert policy.destination("audit-db").endpoint.ports == {5432}
    assert policy.revision.startswith("sha256:") and len(policy.revision) == 71


def test_wrong_type_names_line_and_key() -> None:
    text = BASE.replace("    jurisdiction: non-EU\n", "    jurisdiction: [non-EU]\n")
    err = _err(text)
    line = BASE.splitlines().index("    jurisdiction: non-EU") + 1
    assert (err.file, err.line, err.key) == ("p.yaml", line, "destinations[2].jurisdiction")
    assert str(err).startswith(f"p.yaml:{line}: destinations[2].jurisdiction: ")


def test_yaml_booleans_are_not_strings() -> None:
    # `jurisdiction: no` is a YAML 1.1 boolean; strict validation must not turn it into "False".
    err = _err(BASE.replace("jurisdiction: non-EU", "jurisdiction: no"))
    assert err.key == "destinations[2].jurisdiction"


def test_missing_key_names_the_parent() -> None:
    err = _err(BASE.replace("    operator: provider-inc\n", ""))
    assert err.key == "destinations[2].operator"
    assert "required key is missing" in str(err)
    assert err.line == BASE.splitlines().index("  - id: provider-us") + 1


def test_unknown_key_is_refused() -> None:
    err = _err(BASE.replace("    effect: deny\n", "    effect: deny\n    efect: allow\n"))
    assert err.key == "rules[0].efect"
    line = BASE.splitlines().index("    effect: deny") + 2
    assert str(err) == f"p.yaml:{line}: rules[0].efect: unknown key (did you mean 'effect'?)"


def test_unknown_key_without_a_close_one_lists_the_known_keys() -> None:
    err = _err(BASE.replace("version: 1\n", "version: 1\nzzz: 1\n"))
    assert str(err) == ("p.yaml:2: zzz: unknown key (known here: version, data_classes, "
                        "classification, destinations, rules, unsafe_allow_all, pii)")


def test_every_schema_problem_is_reported_one_line_each() -> None:
    """Not the first one with "(and 3 more errors)": each key with its own line."""
    text = (BASE.replace("    jurisdiction: non-EU\n", "    jurisdiction: [non-EU]\n")
            .replace("    effect: deny\n", "    effect: deny\n    efect: allow\n")
            .replace("    port: 8000\n", "    port: 80000\n"))
    err = _err(text)
    lines = text.splitlines()
    expected = [
        f"p.yaml:{lines.index('    port: 80000') + 1}: destinations[1].port: "
        "Input should be less than or equal to 65535",
        f"p.yaml:{lines.index('    jurisdiction: [non-EU]') + 1}: destinations[2].jurisdiction: "
        "Input should be a valid string",
        f"p.yaml:{lines.index('    efect: allow') + 1}: rules[0].efect: "
        "unknown key (did you mean 'effect'?)",
    ]
    assert str(err).splitlines() == expected
    assert [str(p) for p in err.problems] == expected
    assert (err.file, err.line, err.key) == ("p.yaml", lines.index("    port: 80000") + 1,
                                             "destinations[1].port")
    assert "more error" not in str(err)


def test_a_union_key_is_one_problem_without_pydantic_member_names() -> None:
    text = BASE.replace("jurisdiction: EU\n", "jurisdiction: 5\n", 1)
    text = text.replace("    effect: deny\n", "    effect: deny\n    constraints: "
                        "{jurisdiction: 5}\n")
    err = _err(text)
    rule = [p for p in err.problems if p.key is not None and p.key.startswith("rules")]
    assert [(p.key, p.problem) for p in rule] == [
        ("rules[0].constraints.jurisdiction", "Input should be a valid string or a valid list")]


def test_a_list_item_that_is_not_a_mapping() -> None:
    err = _err(BASE.replace("destinations:\n", "destinations:\n  - 7\n", 1))
    assert (err.key, err.problems[0].problem) == ("destinations[0]", "must be a mapping")
    assert "instance of" not in str(err)


def test_duplicate_yaml_key_is_refused() -> None:
    err = _err(BASE.replace("    effect: deny\n", "    effect: deny\n    effect: allow\n"))
    assert err.key == "rules[0].effect" and "duplicate key" in str(err)


def test_unknown_class_in_rule() -> None:
    err = _err(BASE.replace("classes: [internal]\n", "classes: [secret]\n"))
    assert err.key == "rules[2].classes[0]" and "unknown data class 'secret'" in str(err)


def test_unknown_destination_in_rule() -> None:
    err = _err(BASE + "  - id: x\n    destinations: [nowhere]\n")
    assert err.key == "rules[4].destinations[0]"
    assert err.line == len(BASE.splitlines()) + 2


def test_every_reference_problem_is_reported() -> None:
    text = (BASE.replace("classes: [internal]\n", "classes: [secret]\n")
            .replace("- id: internal-eu", "- id: public-anywhere")
            + "  - id: x\n    destinations: [nowhere]\n")
    err = _err(text)
    assert [p.key for p in err.problems] == [
        "rules[2].classes[0]", "rules[3].id", "rules[4].destinations[0]",
        "classification.grants[0].classes[0]"]  # both `classes: [internal]` became secret
    assert len(str(err).splitlines()) == 4


def test_duplicate_ids() -> None:
    err = _err(BASE.replace("- id: vllm-eu-b", "- id: vllm-eu-a"))
    assert err.key == "destinations[1].id" and "duplicate destination id" in str(err)
    err = _err(BASE.replace("- id: internal-eu", "- id: public-anywhere"))
    assert err.key == "rules[3].id"


@pytest.mark.parametrize(
    ("endpoint", "message"),
    [
        ("cidr: 0.0.0.0/0\n    ports: [443]", "every address"),
        ("cidr: ::/0\n    ports: [443]", "every address"),
        ("host: 10.0.0.1", "needs port or ports"),
        ("url: ftp://10.0.0.1/", "needs an explicit port"),
        ("cidr: 10.0.0.1/8\n    ports: [1]", "invalid CIDR"),
        ("host: 10.0.0.1\n    port: 70000", "less than or equal to 65535"),
        ("host: 'not a host'\n    port: 1", "invalid hostname"),
        ("host: 10.0.0.1\n    url: http://10.0.0.1:1", "exactly one of"),
    ],
)
def test_bad_endpoints(endpoint: str, message: str) -> None:
    err = _err(BASE.replace("url: http://10.20.0.11:8000", endpoint))
    assert err.key is not None and err.key.startswith("destinations[0]")
    assert message in str(err)


def test_not_yaml_and_not_mapping() -> None:
    err = _err("version: 1\n  bad: [indent\n")
    assert err.line is not None and "not valid YAML" in str(err)
    assert "must be a YAML mapping" in str(_err("- 1\n"))


def test_file_errors_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(PolicyFileError, match="cannot read policy") as info:
        Policy.from_file(missing)
    assert info.value.file == str(missing)
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE.replace("version: 1", "version: 2"))
    with pytest.raises(PolicyFileError) as info:
        Policy.from_file(bad)
    assert str(info.value).startswith(f"{bad}:1: version: ")


def test_revision_ignores_formatting_but_not_meaning() -> None:
    a = Policy.from_text(BASE)
    block = BASE.replace("tags: [no-training]\n", "tags:\n      - no-training\n")
    reformatted = "# a comment\n" + block
    assert Policy.from_text(reformatted).revision == a.revision
    changed = BASE.replace("region: eu-fr-1", "region: eu-fr-2")
    assert Policy.from_text(changed).revision != a.revision
