"""QuotaService: subjects from config, estimate + admit, context manager release."""

from __future__ import annotations

import pytest

from gateway.quotas import QuotaService, QuotaSettings, RateLimited

pytestmark = pytest.mark.anyio


def service(**data: object) -> QuotaService:
    return QuotaService.from_settings(QuotaSettings.model_validate(data))


async def test_subjects_are_key_then_team_and_skip_unlimited() -> None:
    svc = service(
        defaults={"key": {"requests_per_minute": 10}},
        teams={"search": {"tokens_per_day": 100}},
    )
    names = [s.name for s in svc.subjects("k1", "search")]
    assert names == ["key:k1", "team:search"]
    assert [s.name for s in svc.subjects("k1", "other")] == ["key:k1"]
    assert [s.name for s in svc.subjects("k1", None)] == ["key:k1"]
    assert service().subjects("k1", "t") == ()


async def test_admit_charges_the_estimate_and_settle_corrects() -> None:
    svc = service(defaults={"team": {"tokens_per_minute": 100}})
    await svc.start()
    body = {"model": "m", "prompt": "x" * 200, "max_tokens": 20}  # 50 + 20 tokens
    adm = await svc.admit(key_id="k", team="t", model="m", body=body, endpoint="/v1/completions")
    assert adm.estimated_tokens == 70 and adm.tokens is not None and adm.tokens.remaining == 30
    with pytest.raises(RateLimited):
        await svc.admit(key_id="k2", team="t", model="m", body=body)
    await svc.settle(adm, 20)  # real usage was much lower: 50 tokens come back
    await svc.admit(key_id="k2", team="t", model="m", body=body)
    await svc.aclose()


async def test_unlimited_requests_skip_the_limiter() -> None:
    svc = service(defaults={"key": {"max_concurrent": 1}}, keys={"vip": {"max_concurrent": None}})
    a = await svc.admit(key_id="vip", team=None, model="m", body={})
    b = await svc.admit(key_id="vip", team=None, model="m", body={})
    assert a.subjects == () and b.subjects == ()


async def test_request_context_releases_on_error() -> None:
    svc = service(defaults={"key": {"max_concurrent": 1}})
    with pytest.raises(RuntimeError):
        async with svc.request(key_id="k", team=None, model="m", body={}):
            with pytest.raises(RateLimited) as info:
                await svc.admit(key_id="k", team=None, model="m", body={})
            assert info.value.kind == "concurrency"
            raise RuntimeError("upstream failed")
    async with svc.request(key_id="k", team=None, model="m", body={}) as adm:
        assert adm.subjects[0].name == "key:k"
