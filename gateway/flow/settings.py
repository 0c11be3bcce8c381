"""The ``flow_control:`` section: priority classes, fair shares and saturation thresholds.

Example::

    flow_control:
      enabled: true
      classes:                      # highest priority first
        - {name: interactive, max_queue: 100, max_wait_s: 5}
        - {name: standard, max_queue: 500, max_wait_s: 30}
        - {name: batch, max_queue: 2000, max_wait_s: 300,
           saturation: {queue_depth: 2, in_flight: 4}}   # batch holds at most 4 per replica
      default_class: standard
      share_by: key                 # fair sharing between keys (or teams) within a class
      share_cost: tokens            # ... of estimated tokens (or of requests)
      header: x-priority            # a request may name a LOWER class here, never a higher one
      saturation: {queue_depth: 4, kv_usage: 0.9, in_flight: null}
      keys: {batch-etl: {class: batch, weight: 1}}
      teams: {search: {class: interactive, weight: 2}}
      vllm_priority_models: []      # models whose vLLM runs --scheduling-policy priority

A key's class and weight come from ``keys`` (by key id), else ``teams`` (by the key's team),
else ``default_class`` with weight 1. This covers keys of the config, of ``keys_file`` and of
the managed key store alike (they are named by id and team).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

__all__ = ["FlowClassSettings", "FlowControlSettings", "FlowShare", "ReserveSettings",
           "SaturationSettings"]

_CLASS_NAME = r"^[a-z][a-z0-9_-]{0,31}$"


def _num(value: float | None) -> str:
    """A threshold as written (``4``, not ``4.0``; ``None``: ``none``)."""
    if value is None:
        return "none"
    return str(int(value)) if float(value).is_integer() else str(value)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class SaturationSettings(_Frozen):
    """When a replica is full (any one threshold reached means full).

    Attributes:
        queue_depth: Requests in the replica's vLLM waiting queue at which it is full: the
            ``vllm:num_requests_waiting`` of the last scrape plus the requests the gateway sent
            it since, minus those that ended since (the estimate between two scrapes).
        kv_usage: KV-cache usage (``vllm:kv_cache_usage_perc``, 0..1) at which it is full (known
            only per scrape).
        in_flight: Requests **of this class and the classes below it** that the gateway has in
            flight to the replica at which it is full for this class (``None``: no such
            threshold). A higher class's requests never count against it, and the classes
            below can never take more than it leaves: ``interactive`` at 8 (``max_num_seqs``)
            and ``batch`` at 4 lets batch hold at most 4 of a replica's 8 sequence slots and
            interactive the rest, whatever batch holds. Works without scraped metrics (for
            example when ``routing.metrics`` is off or the scrape is stale). With
            ``gateway serve --workers N`` each worker enforces its share (see
            :meth:`FlowControlSettings.limits`), so at least ``N`` is required.
        prefill_tokens: Prompt tokens waiting for their prefill on the replica at which it is
            full (``None``: no such threshold): the uncached prompt tokens of the requests the
            gateway sent it whose response has not started (``prefix_affinity`` pools only,
            :mod:`gateway.fleet.scoring`; exact cached prefixes when the replica publishes KV
            events). Judges saturation in work rather than in requests: one 4,000-token batch
            prompt weighs as much as many short ones. With ``--workers N`` each worker counts
            its own and assumes the others' is the same (as ``queue_depth``).
    """

    queue_depth: float = Field(default=4, ge=1, allow_inf_nan=False)
    kv_usage: float = Field(default=0.9, gt=0, le=1.0, allow_inf_nan=False)
    in_flight: int | None = Field(default=None, ge=1)
    prefill_tokens: float | None = Field(default=None, ge=1, allow_inf_nan=False)

    def within(self, other: SaturationSettings) -> bool:
        """True when every threshold of ``self`` is at most the same one of ``other``."""
        return not self.above(other)

    def above(self, other: SaturationSettings) -> list[tuple[str, float, float]]:
        """The thresholds of ``self`` higher than the same one of ``other``.

        Returns:
            ``(name, mine, theirs)`` per such threshold, in field order (``in_flight``
            ``None``, no threshold, counts as unbounded).
        """
        unbounded = float(1 << 62)
        out: list[tuple[str, float, float]] = []
        for name in ("queue_depth", "kv_usage", "in_flight", "prefill_tokens"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if (unbounded if mine is None else mine) > (unbounded if theirs is None else theirs):
                out.append((name, mine, theirs))
        return out


class FlowClassSettings(_Frozen):
    """One priority class.

    Attributes:
        name: Class name (``interactive``, ``batch``, ...).
        max_queue: Requests of this class that may wait in the gateway (per model); one more
            is refused with 429 ``queue_full``.
        max_wait_s: Longest wait in the gateway, seconds; then 429 ``queue_timeout``.
        max_queue_share: Fraction of ``max_queue`` one flow (a key, or a team) may hold
            (at least one request); one more from it is refused with 429 ``flow_queue_full``
            while the queue still has room for other flows, so one key cannot fill it.
            Default 1.0 (off: one key may fill the queue, as before); 0.25 to 0.5 is the
            intended setting where several keys share a class.
        saturation: Thresholds for this class (default: those of the class above it, the
            section's for the first class). A lower class may only have the same or lower
            thresholds than a higher one: the headroom between them is kept for the higher
            classes.
        vllm_priority: The ``priority`` sent to models in ``vllm_priority_models`` (vLLM:
            lower is served first); default: the class's position (0 for the first).
    """

    name: str = Field(pattern=_CLASS_NAME)
    max_queue: int = Field(default=1000, ge=0)
    max_wait_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    max_queue_share: float = Field(default=1.0, gt=0, le=1, allow_inf_nan=False)
    saturation: SaturationSettings | None = None
    vllm_priority: int | None = None


class FlowShare(_Frozen):
    """The class and fair-share weight of a key or team.

    Attributes:
        class_: Priority class name (YAML key ``class``).
        weight: Share of the class's dispatches relative to the other keys (or teams) waiting
            in it (deficit round robin quantum), greater than 0.
    """

    class_: str = Field(alias="class")
    weight: float = Field(default=1.0, ge=0.01, le=1000, allow_inf_nan=False)


def _default_classes() -> list[FlowClassSettings]:
    return [
        FlowClassSettings(name="interactive", max_queue=100, max_wait_s=5.0),
        FlowClassSettings(name="standard", max_queue=500, max_wait_s=30.0),
        FlowClassSettings(name="batch", max_queue=2000, max_wait_s=300.0),
    ]


class SharedFlowSettings(_Frozen):
    """``flow_control.shared``: in-flight counts shared by every gateway process via Redis
    (:mod:`gateway.flow.peers`).

    Attributes:
        redis_url: ``redis://host:port/db`` (the quotas' Redis serves).
        key_prefix: Prefix of the per-process keys.
        interval_s: Seconds between two publications (and reads) of the counts.
        ttl_s: A process's counts expire this long after its last publication.
        fair_share: Also share, per model, class and key (or team), the cost each process
            dispatched recently and the requests it has waiting, so that the fair share
            between keys within a class and ``max_queue_share`` hold for the whole fleet
            (:mod:`gateway.flow.fleetshare`); off: each process judges them on its own queues.
        fair_half_life_s: Half-life of the recently dispatched cost that fair share compares,
            seconds: how long a key that was served a lot yields to the others.
    """

    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "sg:flow:"
    interval_s: float = Field(default=0.1, gt=0, allow_inf_nan=False)
    ttl_s: float = Field(default=2.0, gt=0, allow_inf_nan=False)
    fair_share: bool = True
    fair_half_life_s: float = Field(default=10.0, gt=0, allow_inf_nan=False)


class ReserveSettings(_Frozen):
    """``flow_control.reserve``: replicas kept free of the lower classes while the higher
    classes' load fits on them (:mod:`gateway.flow.reserve`, docs/flow-control.md "Reserve").

    Attributes:
        replicas: Replicas of each model kept free of the classes below ``for_class`` (the
            first ones in pool order that are available; a pool with no more than this many
            available replicas has no reserve).
        for_class: The class the reserve serves, with the classes above it (default: the
            first class). The classes below it neither prefill nor decode on the reserve
            while it is narrow.
        lift: While the reserve is narrow, the classes below ``for_class`` may use the
            thresholds of ``for_class`` on the other replicas (counted over ``for_class`` and
            every class below), so that they keep the sequence slots they gave up on the
            reserve. Off: they keep their own thresholds there.
        in_flight: Requests of the reserve's classes one reserved replica is sized for
            (default: the ``in_flight`` threshold of ``for_class``; one of the two is
            required). Without ``shared``, each of ``pods x workers`` processes counts its
            share of it (``in_flight // (pods x workers)``), as of every threshold.
        widen_at: Fraction of the capacity (``replicas x in_flight``) at which the reserve
            widens: its classes' requests in flight on the model's replicas reach it (or
            one of them waits in the gateway's queue); every replica then serves every class
            with its own thresholds.
        shrink_at: Fraction of the capacity at or below which the demand must stay for
            ``hold_s`` before the reserve narrows again (at most ``widen_at``).
        hold_s: Seconds the demand must stay at or below ``shrink_at`` before narrowing.
        models: Models the reserve applies to (empty: every flow-controlled model).
        lower_in_flight: Requests of the classes below ``for_class`` that each reserved
            replica still takes while narrow, once the other replicas are full for them
            (default 0: none). Only for replicas whose vLLM splits long prompts into chunks
            (``--long-prefill-token-threshold``) of at most about the tokens an engine step
            computes while it reads the weights (~170 for an 8B model on an H100): their
            prefill then rides in the steps the reserve's classes run anyway and lengthens
            them by a few percent (Sarathi-Serve's piggybacking), where one whole long prompt
            would hold a step for its full prefill. Without ``shared``, each of ``pods x
            workers`` processes takes ``lower_in_flight // (pods x workers)`` of it.
        lower_busy_s: With ``lower_in_flight``, a reserved replica takes requests of the lower
            classes only once the reserve's classes have kept it busy (at least one of their
            requests in flight on it, without a gap) for this many seconds (default 5);
            ``None`` (``null``): whenever the others are full. The chunks of the lower classes
            ride in engine steps that run anyway only while the reserve's classes keep the
            engine busy; on a reserve that is idle between their requests they would make the
            steps an arrival waits for. A lower-class request already there runs to its end.
            Without ``lower_in_flight`` the default does nothing, and a value set explicitly
            is refused.
    """

    replicas: int = Field(default=1, ge=1)
    for_class: str | None = None
    lift: bool = True
    in_flight: int | None = Field(default=None, ge=1)
    widen_at: float = Field(default=1.0, gt=0, le=1, allow_inf_nan=False)
    shrink_at: float = Field(default=0.5, ge=0, le=1, allow_inf_nan=False)
    hold_s: float = Field(default=10.0, ge=0, allow_inf_nan=False)
    models: list[str] = Field(default_factory=list)
    lower_in_flight: int = Field(default=0, ge=0)
    lower_busy_s: float | None = Field(default=5.0, ge=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _check_marks(self) -> ReserveSettings:
        if self.shrink_at > self.widen_at:
            raise ValueError(f"shrink_at: {self.shrink_at} is above widen_at "
                             f"{self.widen_at}; set it at most {self.widen_at}")
        # The default applies only with lower_in_flight; set alone it would be ignored.
        if ("lower_busy_s" in self.model_fields_set and self.lower_busy_s is not None
                and not self.lower_in_flight):
            raise ValueError(f"lower_busy_s: {self.lower_busy_s} has no effect with "
                             "lower_in_flight 0 (it gates the lower-class requests a reserved "
                             "replica takes); set lower_in_flight or remove it")
        return self


class FlowControlSettings(_Frozen):
    """Flow control when the fleet is saturated (see :mod:`gateway.flow`).

    Attributes:
        enabled: Flow control on; off (the default) leaves the relay path as it is.
        classes: Priority classes, highest first (at least one).
        default_class: Class of keys and teams not listed in ``keys``/``teams``.
        share_by: ``key`` or ``team``: whose requests share a class fairly (a key without a
            team counts as its own team).
        share_cost: What a queued request costs its key (or team) in the fair share of its
            class (deficit round robin, :mod:`gateway.flow.queues`): ``tokens`` (default), its
            estimated prompt tokens (UTF-8 bytes / 4 plus a few per message, as
            :mod:`gateway.quotas.tokens` approximates them) plus its completion tokens at
            most (:func:`gateway.quotas.tokens.generation_bound`: the largest of
            ``max_tokens``/``max_completion_tokens``/``max_output_tokens``, times
            ``max(n, best_of)`` and the prompts of a completions list), so that keys share
            the fleet's tokens, not its request count; or ``requests``: 1 each.
        default_max_tokens: The completion tokens counted for a request that sets no maximum
            (``share_cost: tokens``).
        header: Request header that may name a lower class (never a higher one: 403).
        saturation: Default thresholds (see :class:`SaturationSettings`).
        models: Models under flow control (empty: every model).
        keys: Class and weight by key id.
        teams: Class and weight by team.
        vllm_priority_models: Models whose vLLM runs with ``--scheduling-policy priority``: the
            class's ``vllm_priority`` is set as the body's ``priority`` (replacing the client's).
            Other models never get a ``priority`` field from the gateway.
        max_queued_body_bytes: Bytes of request bodies all queued requests may hold together
            (every model and class; with ``--workers N`` each worker holds its ``1/N``). A
            request that would pass it is refused with 429 ``queue_bytes_full``; a body larger
            than the whole budget can never queue: 413 ``body_exceeds_queue_budget``.
            Counted in body bytes as received; a queued request holds its body once (the
            bytes; its parsed values are shed while it waits), so this bounds the memory
            queued bodies hold.
        pods: Gateway pods in front of the same replicas (the Helm chart's replica count).
            Flow control is not shared between pods: each pod enforces ``1/pods`` of every
            ``in_flight`` threshold (``T // pods``, which must be at least 1), and counts its
            own change of in-flight requests and prefill tokens ``pods`` times in the
            ``queue_depth`` and ``prefill_tokens`` estimates, as ``--workers`` does within a
            pod (docs/flow-control.md, "Several pods"). Ignored for ``in_flight`` with
            ``shared``.
        shared: Share the in-flight counts of every gateway process through Redis, so that
            ``in_flight`` thresholds hold for all pods and workers together, unsplit, and
            (``shared.fair_share``) the fair share between keys and ``max_queue_share``.
        reserve: Keep replicas free of the lower classes while the higher classes' load fits
            on them (:class:`ReserveSettings`; ``None``, the default: no reserve).
    """

    enabled: bool = False
    classes: list[FlowClassSettings] = Field(default_factory=_default_classes, min_length=1)
    default_class: str = "standard"
    share_by: str = Field(default="key", pattern=r"^(key|team)$")
    share_cost: str = Field(default="tokens", pattern=r"^(tokens|requests)$")
    default_max_tokens: int = Field(default=1024, ge=0)
    header: str = Field(default="x-priority", pattern=r"^[a-z0-9-]+$")
    saturation: SaturationSettings = Field(default_factory=SaturationSettings)
    models: list[str] = Field(default_factory=list)
    keys: dict[str, FlowShare] = Field(default_factory=dict)
    teams: dict[str, FlowShare] = Field(default_factory=dict)
    vllm_priority_models: list[str] = Field(default_factory=list)
    max_queued_body_bytes: int = Field(default=256 * 1024 * 1024, ge=1)
    pods: int = Field(default=1, ge=1)
    shared: SharedFlowSettings | None = None
    reserve: ReserveSettings | None = None
    # (worker index, worker count) of ``gateway serve --workers``: set by the supervisor
    # (:meth:`for_worker`), never by a config file.
    _worker: tuple[int, int] = PrivateAttr(default=(0, 1))

    @model_validator(mode="after")
    def _check_classes(self) -> FlowControlSettings:
        names = [c.name for c in self.classes]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise ValueError(f"classes[{i}].name: duplicate class {name!r}")
        if self.default_class not in names:
            raise ValueError(f"default_class: {self.default_class!r} is not a class "
                             f"(classes: {', '.join(names)})")
        for where, shares in (("keys", self.keys), ("teams", self.teams)):
            for who, share in shares.items():
                if share.class_ not in names:
                    raise ValueError(f"{where}.{who}.class: {share.class_!r} is not a class "
                                     f"(classes: {', '.join(names)})")
        previous, above = self.saturation, "the section's saturation"
        for i, cls in enumerate(self.classes):
            limits = cls.saturation or previous
            for name, mine, theirs in limits.above(previous):
                # A threshold the class does not write is its default: say so, the line of
                # the class's saturation mapping is all a reader can find for it.
                unset = cls.saturation is not None and name not in cls.saturation.model_fields_set
                raise ValueError(
                    f"classes[{i}].saturation.{name}: {_num(mine)}{' (the default)' * unset} "
                    f"is higher than {_num(theirs)} of {above}; a lower class may not have "
                    "higher thresholds than the class above it (the headroom is the higher "
                    f"classes'): set {name} to at most {_num(theirs)}")
            previous, above = limits, f"class {cls.name!r} (classes[{i}])"
        reserve = self.reserve
        if reserve is not None:
            top = reserve.for_class or names[0]
            if top not in names:
                raise ValueError(f"reserve.for_class: {top!r} is not a class "
                                 f"(classes: {', '.join(names)})")
            if top == names[-1]:
                raise ValueError(f"reserve.for_class: {top!r} is the last class: no class "
                                 "below it to keep off the reserve")
            if reserve.in_flight is None and self.thresholds()[names.index(top)].in_flight is None:
                raise ValueError(f"reserve.in_flight: not set, and class {top!r} has no "
                                 "in_flight threshold to size the reserve by; set one")
        for where, value in ([] if self.shared is not None else self.small_in_flight(1)):
            raise ValueError(f"{where}: {value} is less than pods {self.pods}: each pod "
                             f"enforces {value} // {self.pods} = 0 of it; set at least "
                             f"{self.pods}")
        return self

    @property
    def workers(self) -> int:
        """Gateway worker processes that share the replicas (1 unless :meth:`for_worker`)."""
        return self._worker[1]

    def for_worker(self, index: int, workers: int) -> FlowControlSettings:
        """These settings as worker ``index`` of ``workers`` enforces them (see :meth:`limits`).

        Raises:
            ValueError: ``index`` is not in ``0..workers-1``.
        """
        if not 0 <= index < workers:
            raise ValueError(f"worker index {index} is not in 0..{workers - 1}")
        out = self.model_copy()
        out._worker = (index, workers)
        return out

    def thresholds(self) -> list[SaturationSettings]:
        """The thresholds of each class as configured, in class order (a class without its own
        inherits the class above; the first, the section's)."""
        out: list[SaturationSettings] = []
        previous = self.saturation
        for cls in self.classes:
            previous = cls.saturation or previous
            out.append(previous)
        return out

    def limits(self) -> list[SaturationSettings]:
        """The thresholds of each class that this gateway process enforces, in class order.

        One process (``workers`` 1): :meth:`thresholds`. Worker ``i`` of ``N`` (each keeps its
        own in-flight counts) enforces its share of every ``in_flight`` threshold ``T``:
        ``T // N``, plus one for the first ``T % N`` workers, so the shares of the ``N`` workers
        add up to ``T`` exactly and a class never holds more than ``T`` requests on a replica
        in all. The split is static: it bounds what each worker may send, not which worker the
        clients' connections reach, so a class whose requests all reach one worker gets that
        worker's share only. A share is never 0: :meth:`small_in_flight` names thresholds below
        ``N`` and ``gateway serve --workers N`` refuses them. ``queue_depth`` and ``kv_usage``
        are not split (see :mod:`gateway.flow.saturation` for how ``queue_depth`` is shared).
        """
        index, workers = self._worker
        out = self.thresholds()
        if self.shared is not None:
            return out  # every process counts every other's requests (gateway.flow.peers)
        if self.pods > 1:
            out = [lim if lim.in_flight is None else lim.model_copy(update={
                       "in_flight": max(1, lim.in_flight // self.pods)})
                   for lim in out]
        if workers == 1:
            return out
        return [lim if lim.in_flight is None else lim.model_copy(update={
                    "in_flight": lim.in_flight // workers
                    + (1 if index < lim.in_flight % workers else 0)})
                for lim in out]

    @property
    def processes(self) -> int:
        """Gateway processes sharing the replicas: ``pods x workers``."""
        return self.pods * self._worker[1]

    def small_in_flight(self, workers: int) -> list[tuple[str, int]]:
        """``(setting, value)`` of every configured ``in_flight`` threshold below ``workers``
        (a worker's share of it would be 0), e.g. ``("classes[1].saturation.in_flight", 1)``."""
        found: list[tuple[str, int]] = []
        sections = [("saturation", self.saturation)] + [
            (f"classes[{i}].saturation", c.saturation) for i, c in enumerate(self.classes)]
        for where, sat in sections:
            if (sat is not None and sat.in_flight is not None
                    and sat.in_flight // self.pods < workers):
                found.append((f"{where}.in_flight", sat.in_flight))
        return found

    def prefill_thresholds(self) -> list[str]:
        """Where a ``prefill_tokens`` threshold is set (``saturation``,
        ``classes[1].saturation``, ...), in config order."""
        sections = [("saturation", self.saturation)] + [
            (f"classes[{i}].saturation", c.saturation) for i, c in enumerate(self.classes)]
        return [where for where, sat in sections
                if sat is not None and sat.prefill_tokens is not None]

    def covers(self, model: str) -> bool:
        """True when flow control is on for the model with canonical name ``model``."""
        return self.enabled and (not self.models or model in self.models)

    def model_references(self) -> list[tuple[str, list[str], bool]]:
        """Every setting of the section that names models, for the check against the
        config's models (:class:`gateway.config.settings.Settings`).

        Returns:
            ``(setting, names, flow_controlled)`` per setting (``"models"``,
            ``"vllm_priority_models"``, ``"reserve.models"``), where ``flow_controlled`` says
            that a name must also be a model under flow control (one in ``models`` when that
            is set): the setting acts on flow-controlled models only, so another model named
            there would be ignored, not served as written.
        """
        refs = [("models", self.models, False),
                ("vllm_priority_models", self.vllm_priority_models, True)]
        if self.reserve is not None:
            refs.append(("reserve.models", self.reserve.models, True))
        return refs
