"""Same-batch scheduling and pairing of benchmark samples (pure: no Dagster, Triton or torch).

GPU clocks, temperature and neighbours drift between steps, processes and pods. A variant timed in
round 3 and compared with a baseline timed once in ``baseline_metrics`` carries that drift into its
verdict. Here every benchmark batch re-times the baseline in the same worker process, interleaved with
the variants, and each variant is compared only with the baseline samples of its own batch:

* ``schedule`` lays out the order of the timing slots of one batch: ``interleaved`` is
  ``B v1 B v2 ... B vn B`` repeated ``rounds`` times (every variant has a baseline slot on each side);
  ``random-blocks`` shuffles the variant order within each round (seeded) and keeps a baseline slot
  between every two variants, so a periodic disturbance cannot line up with one variant;
* ``run_batch`` calls a timer for each slot, in order, and collects the samples per config;
* ``baseline_for`` pairs a variant with its batch's baseline samples, and refuses (NEEDS_REVIEW with
  a reason) when the two sides were not taken in the same batch or on the same device.

The timer is any callable ``timer(key, slot) -> list[float]`` (ms): ``kernels/measure.py`` passes one
that runs ``triton.testing.do_bench``; the tests pass a fake one that drifts between batches.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

ORDERS = ("interleaved", "random-blocks")
DEFAULT_ORDER = "interleaved"
DEFAULT_ROUNDS = 4
BASELINE = "baseline"


@dataclass(frozen=True)
class Slot:
    """One timing slot: which config (``key``), in which round, at which position of the batch."""

    key: str
    round: int
    position: int


def schedule(variants: Sequence[str], rounds: int = DEFAULT_ROUNDS, order: str = DEFAULT_ORDER, seed: int = 0,
             baseline: str = BASELINE) -> list[Slot]:
    """The slots of one batch, baseline included (see the module docstring)."""
    if order not in ORDERS:
        raise ValueError(f"unknown batch order {order!r}; allowed: {', '.join(ORDERS)}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    names = list(variants)
    if baseline in names:
        raise ValueError(f"a variant may not be named {baseline!r}: that name is the batch's baseline")
    if len(set(names)) != len(names):
        raise ValueError("variant keys in one batch must be distinct")
    rng = random.Random(seed)
    keys: list[tuple[str, int]] = []
    for r in range(rounds):
        body = list(names)
        if order == "random-blocks":
            rng.shuffle(body)
        keys.append((baseline, r))
        for name in body:
            keys.append((name, r))
            keys.append((baseline, r))
    return [Slot(k, r, i) for i, (k, r) in enumerate(keys)]


@dataclass
class Batch:
    """The samples of one batch per config key, in slot order, and where they were taken."""

    batch_id: str
    samples: dict[str, list[float]] = field(default_factory=dict)
    slots: list[Slot] = field(default_factory=list)
    device: dict = field(default_factory=dict)  # identity at the start (gpu uuid, host, clocks, ...)
    device_end: dict = field(default_factory=dict)  # the same read at the end (clocks drift)

    def baseline(self, baseline: str = BASELINE) -> list[float]:
        return self.samples.get(baseline, [])


def run_batch(batch_id: str, variants: Sequence[str], timer: Callable[[str, Slot], Sequence[float]],
              rounds: int = DEFAULT_ROUNDS, order: str = DEFAULT_ORDER, seed: int = 0,
              identity: Callable[[], dict] | None = None, baseline: str = BASELINE) -> Batch:
    """Time every slot of ``schedule(variants, ...)`` in order; samples are kept per config key."""
    slots = schedule(variants, rounds=rounds, order=order, seed=seed, baseline=baseline)
    out = Batch(batch_id=batch_id, slots=slots, device=dict(identity()) if identity else {})
    for slot in slots:
        got = [float(x) for x in timer(slot.key, slot)]
        out.samples.setdefault(slot.key, []).extend(got)
    out.device_end = dict(identity()) if identity else {}
    return out


def device_key(identity: dict) -> tuple[str, str]:
    """(host, gpu) of an identity dict: the uuid where known, else the name."""
    return (str(identity.get("host", "")), str(identity.get("gpu_uuid") or identity.get("gpu_name") or ""))


@dataclass(frozen=True)
class Pairing:
    """What a variant's verdict compares: its samples and the baseline samples of the same batch."""

    ok: bool
    reason: str
    variant: list[float]
    baseline: list[float]
    batch_id: str = ""


def baseline_for(variant_batch: str, variant_device: dict, variant_samples: Sequence[float],
                 baseline_batch: str, baseline_device: dict, baseline_samples: Sequence[float]) -> Pairing:
    """Pair a variant's samples with baseline samples, only when they share the batch and the device."""
    v, b = list(variant_samples), list(baseline_samples)
    if device_key(variant_device) != device_key(baseline_device):
        vh, vg = device_key(variant_device)
        bh, bg = device_key(baseline_device)
        return Pairing(False, f"samples from different GPUs: variant on {vg or '?'} ({vh or '?'}), "
                              f"baseline on {bg or '?'} ({bh or '?'}); re-run both in one batch on one GPU", v, b)
    if variant_batch != baseline_batch:
        return Pairing(False, f"baseline timed in batch {baseline_batch or '?'}, variant in batch "
                              f"{variant_batch or '?'}: not the same batch", v, b)
    if not b:
        return Pairing(False, f"batch {variant_batch} has no baseline samples", v, b)
    return Pairing(True, f"same batch {variant_batch}", v, b, variant_batch)


# --- the timing plan: one value, read from the spec alone, for every kind of variant -------------


@dataclass(frozen=True)
class TimingPlan:
    """How the variants of a spec are timed, whatever they are (a config, a patch, or both).

    Made from the spec alone (``from_spec``): the slot order, the rounds (``looks()``: one look of
    ``rounds`` when the sampling is fixed, else looks from ``rounds`` up to ``max_rounds`` following
    ``kregress.core.stats.SequentialDesign``), the baseline re-timed in the same batch between every two
    variants (always), the clock setting and the GPU-seconds cap per sweep round. Both timing paths read
    this value: ``resources.gpu.CudaBackend`` for configs (one ``measure_batch`` job per look, see
    ``job_fields``) and the patch gate (``kernels.candidate.PatchTimer``), which times a patch's sandboxed
    child beside the baseline's slot by slot with the same ``kernels.measure.time_slots``; both go
    through ``run_groups`` (forecast order, GPU-seconds cap) and ``run_looks`` (the adaptive looks).
    """

    order: str = DEFAULT_ORDER
    rounds: int = DEFAULT_ROUNDS
    max_rounds: int = DEFAULT_ROUNDS
    warmup_ms: int = 25
    rep_ms: int = 100
    lock_clocks: tuple[int, int] | None = None
    gpu_seconds_cap: float | None = None  # per sweep round; None: no cap
    interleaved_baseline: bool = True  # the baseline re-timed between every two variants of the batch
    confidence: float = 0.90  # the verdict's; spent over the looks when the sampling is adaptive

    @classmethod
    def from_spec(cls, spec) -> "TimingPlan":
        b = spec.benchmark
        lock = tuple(int(x) for x in b.lock_clocks.split(",")) if b.lock_clocks else None
        return cls(order=b.batch_order, rounds=b.batch_rounds, max_rounds=b.max_batch_rounds or b.batch_rounds,
                   warmup_ms=b.warmup_ms, rep_ms=b.rep_ms, lock_clocks=lock,  # type: ignore[arg-type]
                   gpu_seconds_cap=b.max_gpu_seconds_per_round, confidence=spec.regression_guard.confidence)

    @property
    def adaptive(self) -> bool:
        return self.max_rounds > self.rounds

    def design(self):
        """The sequential design over rounds (``kregress.core.stats.SequentialDesign``; one look when fixed)."""
        from kregress.core.stats import SequentialDesign

        return SequentialDesign(start=self.rounds, cap=self.max_rounds, confidence=self.confidence)

    def looks(self) -> tuple[int, ...]:
        """Rounds timed so far at each look: (rounds,) when fixed."""
        return self.design().looks()

    def look_confidence(self, look: int) -> float:
        """The verdict's confidence for a variant whose sampling stopped at ``look`` (0-based)."""
        return self.design().look_confidence(look)

    @property
    def slot_ms(self) -> int:
        """Each slot's do_bench time: ``rep_ms`` spread over the first look's rounds (every round after
        that adds the same again)."""
        return max(1, int(round(self.rep_ms / self.rounds)))

    @property
    def slot_warmup_ms(self) -> int:
        return max(1, self.warmup_ms // self.rounds)

    def job_fields(self, rounds: int | None = None) -> dict:
        """The timing fields of one ``measure_batch`` worker job (``kernels/worker.py``) for a look that
        adds ``rounds`` rounds (the first look's by default); ``rep_ms`` is scaled so that every slot
        still runs ``slot_ms``."""
        r = self.rounds if rounds is None else rounds
        return {"warmup_ms": self.slot_warmup_ms * r, "rep_ms": self.slot_ms * r, "rounds": r, "order": self.order,
                "lock_clocks": list(self.lock_clocks) if self.lock_clocks else None}

    def describe(self) -> str:
        how = (f"{self.rounds} rounds" if not self.adaptive
               else f"{self.rounds} rounds, more up to {self.max_rounds} while a verdict is open (looks at "
                    f"{', '.join(map(str, self.looks()))})")
        lock = f", clocks locked {self.lock_clocks[0]},{self.lock_clocks[1]} MHz" if self.lock_clocks else ""
        cap = f", at most {self.gpu_seconds_cap:g} GPU-s per round" if self.gpu_seconds_cap else ""
        return f"{self.order}, baseline re-timed between every two variants, {how}{lock}{cap}"


# --- the looks and the groups: one loop for every kind of variant ----------------------------------


def merge_looks(before: list, new: list) -> list:
    """Per shape, the samples of the looks so far (``Measurement`` lists): ``new``'s samples appended to
    ``before``'s (same shape order), p20/p50/p80 and throughput recomputed, the identity read at the first
    look's start and the last look's end."""
    import numpy as np

    if not before:
        return list(new)
    out = []
    for a, b in zip(before, new):
        samples = list(a.samples_ms) + list(b.samples_ms)
        q20, q50, q80 = (float(x) for x in np.quantile(samples, [0.2, 0.5, 0.8]))
        scale = a.p50_ms / q50 if q50 > 0 else 0.0
        out.append(a.model_copy(update={
            "samples_ms": samples, "p20_ms": q20, "p50_ms": q50, "p80_ms": q80,
            "tflops": a.tflops * scale, "gbps": a.gbps * scale,
            "sm_clock_mhz_end": b.sm_clock_mhz_end, "mem_clock_mhz_end": b.mem_clock_mhz_end}))
    return out


def verdict_open(plan: TimingPlan, spec, look: int, variant: list, baseline: list) -> bool:
    """Whether a variant's verdict is still open after ``look`` (its interval straddles the guard):
    ``kregress.core.stats.judge_look`` with the plan's sequential design and the spec's guard."""
    from kregress.core import stats
    from kregress.core.names import NEEDS_REVIEW

    rg = spec.regression_guard
    return stats.judge_look(plan.design(), look, [m.samples_ms for m in variant], [m.samples_ms for m in baseline],
                            guard=rg.not_worse_than_baseline_ratio, min_samples=rg.min_samples,
                            seed=spec.search.seed).verdict == NEEDS_REVIEW


@dataclass
class Looks:
    """What ``run_looks`` timed: per variant key its merged Measurements, the baseline samples of the looks
    it took part in, and (rounds, looks) it took; ``error``: why the first look failed (nothing timed)."""

    got: dict = field(default_factory=dict)
    base_of: dict = field(default_factory=dict)
    base_all: list = field(default_factory=list)
    taken: dict = field(default_factory=dict)  # key -> (timing_rounds, timing_looks)
    done_rounds: int = 0
    error: str | None = None

    def apply(self, rows: list, keys: dict) -> None:
        """Set measurements, batch_baseline, timing_rounds/looks and evidence of ``rows[i]`` for ``i -> key``."""
        for i, k in keys.items():
            row = rows[i]
            row.measurements, row.batch_baseline = self.got.get(k, []), self.base_of.get(k, [])
            if k in self.taken:
                row.timing_rounds, row.timing_looks = self.taken[k]
            row.evidence = "cuda" if row.measurements else row.evidence


def run_looks(plan: TimingPlan, spec, keys: Sequence[str], measure: Callable[[int, int, list[str]], "dict | str"],
              log: Callable[[str], None] = print, label: str = "") -> Looks:
    """The plan's looks over one batch's variants: ``measure(look, rounds to add, open keys)`` times one look
    (``{BASELINE: [...], key: [...]}`` Measurements per shape, or an error text) and after each look only
    the variants whose verdict is still open (``verdict_open``) get the next look's rounds, the baseline
    re-timed beside them. The same loop for a config batch (a worker's ``measure_batch`` job per look) and
    a patch (its sandboxed children, slot by slot)."""
    looks = plan.looks()
    out = Looks()
    open_ = list(keys)
    for look, total in enumerate(looks):
        res = measure(look, total - out.done_rounds, open_)
        if isinstance(res, str):
            if look == 0:
                out.error = res
            else:
                log(f"{label} look {look + 1} failed ({res[:160]}); the verdicts use the looks before it")
            break
        out.done_rounds = total
        base = res[BASELINE]
        out.base_all = merge_looks(out.base_all, base)
        for k in open_:
            out.got[k] = merge_looks(out.got.get(k, []), res[k])
            out.base_of[k] = merge_looks(out.base_of.get(k, []), base)
            out.taken[k] = (total, look + 1)
        if look == len(looks) - 1:
            break
        still = [k for k in open_ if verdict_open(plan, spec, look, out.got[k], out.base_of[k])]
        if not still:
            break
        log(f"look {look + 1} of {label}: {len(open_) - len(still)} verdict(s) settled at {total} rounds, "
            f"{len(still)} still open: {looks[look + 1]} rounds for those")
        open_ = still
    return out


def forecast_order(rows: list, idx: list[int]) -> list[int]:
    """``idx`` best forecast first (highest expected_speedup; no forecast last), proposal order among equals."""
    return sorted(idx, key=lambda i: (rows[i].expected_speedup is None, -(rows[i].expected_speedup or 0.0), i))


def run_groups(plan: TimingPlan, rows: list, timed: list[int], time_group: Callable[[list[int]], float],
               log: Callable[[str], None] = print, together: Callable[[int], bool] = lambda i: True) -> None:
    """Time a round's variants best forecast first, ``time_group(indices) -> GPU seconds spent`` per batch.
    Variants for which ``together`` holds share one batch; the others (a patch: its own sandboxed child)
    are a batch each. With the plan's GPU-seconds cap every variant is its own batch (the baseline re-timed
    beside it) and the round stops once the cap is spent: the variants left get no timing and say why."""
    order = forecast_order(rows, timed)
    cap = plan.gpu_seconds_cap
    if cap:
        groups = [[i] for i in order]
    else:
        shared = [i for i in order if together(i)]
        groups = ([shared] if shared else []) + [[i] for i in order if not together(i)]
    spent = 0.0
    for g, group in enumerate(groups):
        if cap and spent >= cap:
            left = [i for grp in groups[g:] for i in grp]
            for i in left:
                rows[i].error_detail = (f"not timed: the round's GPU time cap (benchmark.max_gpu_seconds_per_round={cap:g}) "
                                        f"was spent ({spent:.1f} s) on variants with a better forecast")
            log(f"round stopped early: {spent:.1f} s of GPU timing reached benchmark.max_gpu_seconds_per_round={cap:g}; "
                f"{len(left)} variant(s) not timed: {', '.join(rows[i].variant_id for i in left)}")
            return
        spent += time_group(group)
