"""The W3C ``traceparent`` parser that links model calls and tool calls in the audit log.

OpenTelemetry's ``TraceContextTextMapPropagator`` is the oracle: for any header value (valid
ones, near-misses and random text) our parser finds the same trace id, or none when it finds
none. Before this parser, the relay lower-cased uppercase ids and accepted version ``ff`` and
an all-zero parent id; the MCP endpoint had a second parser of its own.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.relay.records import trace_id_of

_ORACLE = TraceContextTextMapPropagator()
_HEX = "0123456789abcdef"
_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
_PARENT = "00f067aa0ba902b7"


def oracle(value: str) -> str | None:
    """The trace id OpenTelemetry extracts from ``value``, or ``None``."""
    ctx = trace.get_current_span(_ORACLE.extract({"traceparent": value})).get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


def test_the_spec_examples_and_the_invalid_forms_a_tester_sent() -> None:
    assert trace_id_of(f"00-{_TRACE}-{_PARENT}-01") == _TRACE
    assert trace_id_of(f"00-{_TRACE}-{_PARENT}-01".encode()) == _TRACE
    assert trace_id_of(f"01-{_TRACE}-{_PARENT}-01-future") == _TRACE  # a later version
    for bad in (f"ff-{_TRACE}-{_PARENT}-01",             # version ff is invalid
                f"00-{_TRACE.upper()}-{_PARENT}-01",     # uppercase is invalid, not lowered
                f"00-{_TRACE}-{'0' * 16}-01",            # all-zero parent id
                f"00-{'0' * 32}-{_PARENT}-01",           # all-zero trace id
                f"00-{_TRACE}-{_PARENT}-01-extra",       # version 00 has four fields
                f"00-{_TRACE}-{_PARENT}-1", "", None):
        assert trace_id_of(bad) is None, bad
        if bad:
            assert oracle(bad) is None, bad


def _field(n: int) -> st.SearchStrategy[str]:
    near = st.text(alphabet=_HEX + "ABCDEFgx-", min_size=n - 1, max_size=n + 1)
    return st.one_of(st.text(alphabet=_HEX, min_size=n, max_size=n), st.just("0" * n), near)


_headers = st.one_of(
    st.builds(lambda v, t, p, f, ext, ws: f"{ws}{v}-{t}-{p}-{f}{ext}{ws}",
              st.one_of(st.sampled_from(["00", "01", "fe", "ff", "0A"]), _field(2)),
              _field(32), _field(16), _field(2),
              st.sampled_from(["", "-", "-x", "-x-y", " -x", "x"]),
              st.sampled_from(["", " ", "\t", "  "])),
    # No CR/LF: the HTTP layer refuses them in a field value before any parser sees it.
    st.text(alphabet=st.characters(blacklist_characters="\r\n", max_codepoint=0x7E)),
)


@settings(max_examples=400, deadline=None)
@given(_headers)
def test_the_same_trace_id_as_opentelemetry(value: str) -> None:
    assert trace_id_of(value) == oracle(value)
