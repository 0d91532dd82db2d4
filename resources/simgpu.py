"""A simulated GPU for benchmark steps: a fleet of devices on a machine with none, for measuring the
orchestration (queue, pools, run and step overhead) the way a GPU fleet sees it.

On a real fleet a benchmark step is mostly device time: the host's CPU waits while the GPU runs the batch.
A simulated device reproduces exactly that part and nothing else:

* **selected by the device name**: ``KREGRESS_DEVICE=sim-gpu-<k>`` (``kernel_assets.definitions`` then builds
  the backends below, ``KREGRESS_SIM_SCALE`` setting ``scale``), or by constructing ``SimReplayBackend`` /
  ``SimInterpreterBackend`` with ``sim_device=...`` directly;
* **timing a batch holds the device** for the batch's simulated device time: the recorded kernel time x runs
  (a recorded family: the sum of its recorded runs) or the modelled kernel time x ``runs`` (the interpreter's
  analytic estimate), for every variant timed and the batch's baseline once, times ``scale``. Holding is an
  exclusive ``flock`` on the device's lock file (a second process timing on the same device waits, as it
  would for a real GPU, and the hold records that it had to) and a ``time.sleep``: no CPU is used;
* **its identity is recorded like a real device's**: every measurement of the batch gets ``gpu_name``
  ``simulated GPU``, ``gpu_uuid`` the device name (the same string the device pool ``gpu/<host>/<device>``
  is keyed by, ``kregress.core.names.device_pool``), the host, and ``driver`` ``simulated (sleep, scale x)``;
  verdicts and history keep devices apart by that identity, as for real GPUs;
* **everything else is real**: the parent backend compiles, checks correctness and replays or models latency
  exactly as without simulation; the ledger, the verdict and the report see ordinary rows.

Each hold is appended as one JSON line to ``<log dir>/<host>/<device>.jsonl`` (start, end, seconds, the batch,
the process, whether the device was busy when asked): ``bench/scale.py`` reads them to check, from the
device's side, that no two batches ever overlapped on one device.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pydantic import Field

from kregress.core import paths
from kregress.core.names import device_pool
from kregress.core.records import VariantResult
from resources.gpu import BenchmarkBackend, InterpreterBackend, ReplayBackend

SIM_PREFIX = "sim-gpu-"
ENV_SIM_SCALE = "KREGRESS_SIM_SCALE"
SIM_GPU_NAME = "simulated GPU"
DEFAULT_RUNS = 32  # runs per variant and shape when the evidence has one estimate (Kernel Tuner records 32)


def is_simulated(device: str) -> bool:
    """True for a device name of the form ``sim-gpu-<k>``."""
    return device.startswith(SIM_PREFIX) and len(device) > len(SIM_PREFIX)


def sim_scale(raw: str | None) -> float:
    """``KREGRESS_SIM_SCALE`` as a positive float (empty: 1.0); ValueError naming the variable and the fix."""
    if raw is None or not raw.strip():
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{ENV_SIM_SCALE}={raw!r} must be a positive number (the factor by which a simulated "
                         f"device stretches the recorded or modelled kernel time), e.g. {ENV_SIM_SCALE}=200")
    return value


def batch_device_ms(rows: list[VariantResult], baseline: dict, runs: int = DEFAULT_RUNS) -> float:
    """Unscaled device milliseconds of one timed batch: for every row with measurements, per shape, the sum of
    its samples when it has several (recorded runs), else its p50 x ``runs``; plus each batch's baseline
    samples once (the baseline is re-timed in every batch) unless the batch's own rows include the baseline."""

    def ms(measurements) -> float:
        return sum(sum(m.samples_ms) if len(m.samples_ms) > 1 else m.p50_ms * runs for m in measurements)

    total = 0.0
    batches: dict[str, list] = {}
    has_baseline: set[str] = set()
    for row in rows:
        if not row.measurements:
            continue
        total += ms(row.measurements)
        batch = row.measurements[0].batch
        if row.config == baseline:
            has_baseline.add(batch)
        if row.batch_baseline:
            batches.setdefault(batch, row.batch_baseline)
    return total + sum(ms(base) for b, base in batches.items() if b not in has_baseline)


@dataclass(frozen=True)
class Hold:
    device: str
    label: str
    start: float
    end: float
    seconds: float
    waited_s: float  # seconds spent waiting for the device before the hold (0 when it was free)
    contended: bool


@dataclass(frozen=True)
class SimulatedDevice:
    """One simulated GPU: ``host``/``device`` name it (the pool key's parts), ``log_dir`` keeps its lock and holds."""

    host: str
    device: str
    log_dir: Path

    @property
    def pool(self) -> str:
        return device_pool(self.host, self.device)

    def identity(self, scale: float) -> dict[str, Any]:
        """The Measurement fields a real GPU would fill (kernels.measure.measurement_identity's keys)."""
        return {"gpu_name": SIM_GPU_NAME, "gpu_uuid": self.device, "host": self.host,
                "driver": f"simulated (sleep, scale {scale:g})", "clocks_locked": ""}

    def _files(self) -> tuple[Path, Path]:
        _, host, name = self.pool.split("/")  # the pool key's parts, as Dagster names them
        folder = self.log_dir / host
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"{name}.lock", folder / f"{name}.jsonl"

    def hold(self, seconds: float, label: str = "") -> Hold:
        """Hold the device for ``seconds`` (sleeping; a holder in another process makes this one wait first)."""
        lock_path, log_path = self._files()
        asked = time.time()
        with open(lock_path, "a+") as fh:
            contended = False
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                contended = True
                fcntl.flock(fh, fcntl.LOCK_EX)
            start = time.time()
            try:
                time.sleep(max(0.0, seconds))
                end = time.time()
                hold = Hold(self.device, label, start, end, end - start, start - asked, contended)
                with open(log_path, "a") as log:
                    log.write(json.dumps({"pid": os.getpid(), **hold.__dict__}) + "\n")
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
        return hold

    def holds(self) -> list[Hold]:
        """Every hold this device recorded."""
        _, log_path = self._files()
        if not log_path.is_file():
            return []
        out = []
        for line in log_path.read_text().splitlines():
            d = json.loads(line)
            d.pop("pid", None)
            out.append(Hold(**d))
        return out


def all_holds(log_dir: Path) -> dict[str, list[Hold]]:
    """{pool: its holds} for every simulated device that recorded one under ``log_dir``."""
    out: dict[str, list[Hold]] = {}
    for path in sorted(Path(log_dir).glob("*/*.jsonl")):
        dev = SimulatedDevice(path.parent.name, path.stem, Path(log_dir))
        out[dev.pool] = dev.holds()
    return out


class SimulatedDeviceBackend(BenchmarkBackend):
    """The parent backend's whole evaluate (compile, correctness, replay or model), then the batch's device
    time held on the simulated device, and the device's identity on every measurement."""

    sim_device: str = Field(default="sim-gpu-0", description="The simulated device's name, sim-gpu-<k>: the device "
                                                             "part of its pool gpu/<host>/<device> and its gpu_uuid.")
    sim_host: str = Field(default="", description="The host part of the pool key; empty = this host's name.")
    sim_scale: float = Field(default=1.0, gt=0, description="Device seconds held per second of recorded or modelled "
                                                            "kernel time (KREGRESS_SIM_SCALE).")
    sim_runs: int = Field(default=DEFAULT_RUNS, ge=1, description="Runs per variant and shape when the evidence "
                                                                  "is one estimate (model).")
    sim_log_dir: str = Field(default="", description="Lock and hold log of the devices; empty = $DAGSTER_HOME/simgpu.")

    def device(self) -> SimulatedDevice:
        if not is_simulated(self.sim_device):
            raise ValueError(f"sim_device={self.sim_device!r} is not a simulated device name; use {SIM_PREFIX}<k>, "
                             f"e.g. KREGRESS_DEVICE={SIM_PREFIX}0")
        log_dir = Path(self.sim_log_dir) if self.sim_log_dir else paths.home() / "simgpu"
        return SimulatedDevice(self.sim_host or socket.gethostname(), self.sim_device, log_dir)

    def _evaluate(self, bound, suggestions, log: Callable[[str], None], stats):
        rows = super()._evaluate(bound, suggestions, log, stats)
        kernel_ms = batch_device_ms(rows, bound.spec.baseline, self.sim_runs)
        if kernel_ms <= 0:
            return rows
        dev = self.device()
        ident = dev.identity(self.sim_scale)
        batch = next((r.measurements[0].batch for r in rows if r.measurements), "")
        hold = dev.hold(kernel_ms / 1e3 * self.sim_scale, label=batch or bound.spec.task_id)
        stats.measure_seconds.append(hold.seconds)
        for row in rows:
            row.measurements = [m.model_copy(update=ident) for m in row.measurements]
            row.batch_baseline = [m.model_copy(update=ident) for m in row.batch_baseline]
        log(f"held simulated device {dev.pool} for {hold.seconds:.2f} s: {kernel_ms / 1e3:.4f} s of kernel time "
            f"x {self.sim_scale:g}" + (f" (waited {hold.waited_s:.2f} s for it)" if hold.contended else ""))
        return rows


class SimReplayBackend(SimulatedDeviceBackend, ReplayBackend):
    """Recorded families on a simulated device: the recorded runs as evidence, their time held on the device."""


class SimInterpreterBackend(SimulatedDeviceBackend, InterpreterBackend):
    """Triton families on a simulated device: real AOT compile and interpreter correctness, the modelled
    latency x runs held on the device."""


def simulated_backends(host: str, device: str, scale: float, **kwargs: Any) -> dict[str, BenchmarkBackend]:
    """The ``bench`` and ``replay`` resources of a code location whose device is simulated."""
    common = dict(sim_device=device, sim_host=host, sim_scale=scale, **kwargs)
    return {"bench": SimInterpreterBackend(**common), "replay": SimReplayBackend(**common)}
