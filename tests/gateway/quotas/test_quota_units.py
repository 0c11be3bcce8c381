"""Settings merge rules, header formats and token estimation."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.quotas import (
    Limits,
    QuotaSettings,
    RateLimited,
    TokenEstimator,
    WindowState,
)
from gateway.quotas.errors import BudgetExhausted, InvalidGenerationField
from gateway.quotas.hook import format_duration, refusal_headers, window_headers
from gateway.quotas.tokens import generation_bound


def test_overrides_merge_field_by_field_and_explicit_null_unlimits() -> None:
    qs = QuotaSettings.model_validate(
        {
            "defaults": {
                "key": {"requests_per_minute": 60, "tokens_per_minute": 1000},
                "team": {"tokens_per_day": 10},
            },
            "keys": {"batch": {"requests_per_minute": 5}, "vip": {"tokens_per_minute": None}},
            "teams": {"big": {"tokens_per_month": 99}},
        }
    )
    assert qs.limits_for("key", "batch") == Limits(requests_per_minute=5, tokens_per_minute=1000)
    assert qs.limits_for("key", "vip") == Limits(requests_per_minute=60)
    assert qs.limits_for("key", "other") == Limits(requests_per_minute=60, tokens_per_minute=1000)
    assert qs.limits_for("team", "big") == Limits(tokens_per_day=10, tokens_per_month=99)
    assert qs.backend == "memory" and qs.on_backend_error == "fail_closed"


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"defaults": {"key": {"requests_per_minut": 5}}}, "requests_per_minut"),
        ({"keys": {"k": {"max_concurrent": 0}}}, "max_concurrent"),
        ({"backend": "redis", "redis_url": "http://x"}, "redis_url"),
        ({"on_backend_error": "ignore"}, "on_backend_error"),
    ],
)
def test_invalid_settings_name_the_key(data: dict[str, Any], where: str) -> None:
    with pytest.raises(ValidationError) as info:
        QuotaSettings.model_validate(data)
    assert where in str(info.value)


def test_settings_are_frozen() -> None:
    with pytest.raises(ValidationError):
        QuotaSettings().backend = "redis"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (-3, "0s"),
        (0.0004, "1ms"),
        (0.12, "120ms"),
        (1, "1s"),
        (8.64, "8.64s"),
        (59.999, "59.999s"),
        (360, "6m0s"),
        (90.5, "1m30.5s"),
        (3723, "1h2m3s"),
        (86400, "24h0m0s"),
    ],
)
def test_durations_use_openai_go_style(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_success_headers() -> None:
    headers = window_headers(WindowState(60, 59, 1.0), WindowState(150000, 149984, 0.0064))
    assert headers == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "150000",
        "x-ratelimit-remaining-tokens": "149984",
        "x-ratelimit-reset-tokens": "7ms",
    }
    assert window_headers(None, None) == {}


def test_rate_limited_headers_round_retry_after_up() -> None:
    exc = RateLimited(
        kind="tokens", subject="key:a", limit=100, remaining=3, reset_s=42.2, retry_after_s=2.01
    )
    assert refusal_headers(exc) == {
        "x-ratelimit-limit-tokens": "100",
        "x-ratelimit-remaining-tokens": "3",
        "x-ratelimit-reset-tokens": "42.2s",
        "retry-after": "3",
        "retry-after-ms": "2010",
    }
    assert "key 'a'" in exc.message and "tokens per minute" in exc.message


def test_long_waits_tell_the_sdk_not_to_retry() -> None:
    exc = BudgetExhausted(
        kind="tokens_per_day",
        subject="team:t",
        limit=10,
        remaining=0,
        reset_s=7200,
        retry_after_s=7200,
        requested=5,
    )
    h = refusal_headers(exc)
    assert h["x-should-retry"] == "false" and h["retry-after"] == "7200"
    assert "retry-after-ms" not in h
    assert h["x-ratelimit-limit-tokens-day"] == "10"
    assert exc.openai_error()["error"] == {
        "message": exc.message,
        "type": "tokens_per_day",
        "param": None,
        "code": "insufficient_quota",
    }


CHAT = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "héllo wörld"}]},
    ],
}


def test_approximation_is_bytes_over_four_plus_overhead() -> None:
    est = TokenEstimator().estimate("m", CHAT)
    text = "You are terse.\nhéllo wörld"
    assert est.method == "approx"
    assert est.prompt == math.ceil(len(text.encode()) / 4) + 4 * 2 + 3
    assert est.completion_reserve == 0


def test_completion_reserve_from_max_tokens_capped_and_times_n() -> None:
    estimator = TokenEstimator(completion_reserve_tokens=50, completion_reserve_cap=500)
    assert estimator.estimate("m", {**CHAT, "max_tokens": 200}).completion_reserve == 200
    assert (
        estimator.estimate("m", {**CHAT, "max_completion_tokens": 9999}).completion_reserve == 500
    )
    assert estimator.estimate("m", {**CHAT, "max_tokens": 10, "n": 3}).completion_reserve == 30
    assert estimator.estimate("m", CHAT).completion_reserve == 50
    emb = estimator.estimate("m", {"input": ["a b c", "d"]}, "/v1/embeddings")
    assert emb.completion_reserve == 0 and emb.prompt == math.ceil(len("a b c\nd") / 4)


@pytest.mark.parametrize(("endpoint", "body", "bound"), [
    ("/v1/chat/completions", {"n": 500, "max_tokens": 50}, (50, 500)),
    ("/v1/chat/completions", {"n": "3", "max_completion_tokens": 1, "max_tokens": 9}, (9, 3)),
    ("/v1/completions", {"prompt": ["a"] * 7, "n": 2.0, "best_of": 3, "max_tokens": 5}, (5, 21)),
    ("/v1/completions", {"prompt": [1, 2, 3]}, (16, 1)),  # vLLM's default max_tokens
    ("/v1/completions", {"prompt": [[1], [2]], "max_tokens": None}, (None, 2)),  # no limit
    ("/v1/completions", {"prompt": "a", "max_tokens": 4, "max_completion_tokens": 400},
     (400, 1)),
    ("/v1/responses", {"input": "a", "n": "x", "max_output_tokens": 7}, (7, 1)),
    (None, {"prompt": ["a", "b"], "n": 2}, (None, 4)),
])
def test_generation_bound_counts_every_completion(
    endpoint: str | None, body: dict[str, Any], bound: tuple[int | None, int]
) -> None:
    assert generation_bound(body, endpoint) == bound


def test_flow_cost_counts_an_unreadable_count_as_absent() -> None:
    body = {**CHAT, "n": "many", "max_tokens": 10}
    with pytest.raises(InvalidGenerationField) as info:
        TokenEstimator().estimate("m", body, "/v1/chat/completions", strict=True)
    assert info.value.param == "n" and info.value.status == 400
    assert TokenEstimator().estimate("m", body, "/v1/chat/completions").completion_reserve == 10


def test_token_id_prompts_count_exactly() -> None:
    est = TokenEstimator().estimate("m", {"prompt": [1, 2, 3, 4, 5], "max_tokens": 7})
    assert est.prompt == 5 and est.total == 12
    est = TokenEstimator().estimate("m", {"input": [[1, 2], [3, 4, 5]]}, "/v1/embeddings")
    assert est.prompt == 5


def test_unknown_body_shape_counts_its_json() -> None:
    est = TokenEstimator().estimate("m", {"model": "m", "weird": "x" * 400})
    assert est.prompt > 100


def test_model_tokenizer_from_local_file(minilm_snapshot: Path) -> None:
    from tokenizers import Tokenizer

    estimator = TokenEstimator({"minilm": minilm_snapshot})
    assert estimator.load() == {"minilm": "tokenizer"}
    text = "Tokenization of antidisestablishmentarianism is subword-based."
    est = estimator.estimate("minilm", {"prompt": text})
    reference = Tokenizer.from_file(str(minilm_snapshot / "tokenizer.json"))
    expected = len(reference.encode(text, add_special_tokens=False).ids)
    assert est.method == "tokenizer" and est.prompt == expected
    # A WordPiece tokenizer splits the long word: clearly not the byte approximation.
    assert est.prompt != math.ceil(len(text) / 4)
    # Other models still use the approximation.
    assert estimator.estimate("other", {"prompt": text}).method == "approx"


def test_missing_tokenizer_falls_back_without_download(tmp_path: Path) -> None:
    estimator = TokenEstimator({"m": tmp_path / "nope"})
    assert estimator.load() == {"m": "approx"}
    assert estimator.estimate("m", {"prompt": "abcd" * 10}).prompt == 10


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            {"quotas": {"defaults": {"key": {"requests_per_minute": 0}}}},
            "quotas.defaults.key.requests_per_minute: ",
        ),
        ({"quotas": {"backend": "redis", "redis_url": "http://x"}}, "quotas.redis_url: "),
        ({"keystore": {"refresh_s": 0}}, "keystore.refresh_s: "),
        ({"keystore": {}}, "keystore.store: store is not set"),
    ],
)
def test_check_config_rejects_invalid_limit_sections(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], section: dict[str, Any], message: str
) -> None:
    import yaml

    from gateway.cli import main
    from tests.gateway.helpers import config

    cfg = config(["http://127.0.0.1:9"])
    for model in cfg["models"]:
        model["replicas"] = [{"url": r["url"]} for r in model["replicas"]]
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["check-config", "--config", str(path)]) == 0
    path.write_text(yaml.safe_dump({**cfg, **section}))
    assert main(["check-config", "--config", str(path)]) == 1
    assert message in capsys.readouterr().err
