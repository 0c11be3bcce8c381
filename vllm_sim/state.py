"""Run-time state of one simulator app: request counters, active fault, last request seen.

One ``SimState`` is created per app by ``create_app``; nothing is module-global. All access
happens on the event loop thread, so no locking is needed.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from vllm_sim.config import FaultSpec
from vllm_sim.tokens import Vocab

HISTORY_LEN = 100
"""Number of recent requests kept in ``/sim/stats`` ``history``."""


@dataclass
class SimState:
    """Counters and fault state (reset by ``POST /sim/reset``).

    ``received``/``running``/``completed``/``cancelled``/``aborted`` count inference requests
    (chat, completions, embeddings). ``last_headers``/``last_body`` are those of the last
    inference request; ``history`` lists every request except ``/sim/*``.
    """

    fault: FaultSpec = field(default_factory=FaultSpec)
    fault_remaining: int | None = None
    received: int = 0
    running: int = 0
    completed: int = 0
    cancelled: int = 0
    aborted: int = 0
    errors: int = 0
    faults_applied: int = 0
    last_path: str | None = None
    last_headers: dict[str, str] = field(default_factory=dict)
    last_body: Any = None
    history: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=HISTORY_LEN))
    running_by_model: Counter[str] = field(default_factory=Counter)
    prompt_tokens_total: Counter[str] = field(default_factory=Counter)
    generation_tokens_total: Counter[str] = field(default_factory=Counter)
    success_total: Counter[tuple[str, str]] = field(default_factory=Counter)
    vocab: Vocab = field(default_factory=Vocab)

    def set_fault(self, spec: FaultSpec) -> None:
        """Install ``spec`` as the active fault (replacing any previous one)."""
        self.fault = spec
        self.fault_remaining = spec.count

    def take_fault(self, path: str) -> FaultSpec | None:
        """Return the fault to apply to a request to ``path`` and consume one use of it."""
        spec = self.fault
        if not spec.applies_to(path):
            return None
        if self.fault_remaining is not None:
            self.fault_remaining -= 1
            if self.fault_remaining <= 0:
                self.fault = FaultSpec()
                self.fault_remaining = None
        self.faults_applied += 1
        return spec

    def reset(self) -> None:
        """Clear counters, history and the active fault (the vocabulary is kept)."""
        vocab = self.vocab
        running = self.running
        running_by_model = self.running_by_model
        self.__init__()  # type: ignore[misc]
        self.vocab = vocab
        # Requests still in flight finish after the reset: keep them counted as running so
        # that the gauge does not go negative.
        self.running = running
        self.running_by_model = running_by_model

    def record(self, method: str, path: str, headers: dict[str, str], body: Any) -> None:
        """Remember a request (``history`` and, for inference requests, ``last_*``)."""
        self.history.append({"method": method, "path": path, "headers": headers})
        self.last_path = path
        self.last_headers = headers
        self.last_body = body

    def stats(self) -> dict[str, Any]:
        """The ``GET /sim/stats`` document."""
        return {
            "running": self.running,
            "received": self.received,
            "cancelled": self.cancelled,
            "completed": self.completed,
            "aborted": self.aborted,
            "errors": self.errors,
            "faults_applied": self.faults_applied,
            "fault": self.fault.model_dump(),
            "fault_remaining": self.fault_remaining,
            "last_path": self.last_path,
            "last_headers": self.last_headers,
            "last_body": self.last_body,
            "history": list(self.history),
        }
