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
