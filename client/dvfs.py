"""DVFS on the client: before each local epoch, pick a CPU frequency and apply it, for real or emulated.

The maths (profiles, time, energy, which frequency) is shared/core/dvfs.py; here is what a client process does
with it. `Pacer` is installed on the training thread for one task (fl_services.shared.core.dvfs.EPOCH_HOOK): every
algorithm's epoch loop calls it before each epoch; it closes the epoch that ended (its modelled time and
energy, and its measured progress) and picks the next epoch's frequency under the run's policy:

- max: the top frequency, and cpufreq is left alone (no DVFS: today's behaviour);
- deadline, slack: the cheapest frequency that still finishes the remaining epochs, and the upload, within
  the budget the edge put in the task (fl_services.shared.wire.client_edge.ClientTaskHeader.budget_s; None: full speed).

Backends: `Cpufreq` writes the host's sysfs (`scaling_setspeed` under the userspace governor, otherwise
`scaling_max_freq`) and restores what it changed after the task; progress is measured wall time. Where
no cpufreq is writable the device is `Emulated`: progress is the modelled time, and the worker stretches
the task's wall time to the modelled time × `dvfs.time_scale` (see `emulated_hold`) without holding the
training thread, which the process's other logical clients share.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, Protocol

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.dvfs import (
    EPOCH_HOOK,
    GHZ,
    DeviceProfile,
    comm_seconds,
    epoch_energy,
    epoch_seconds,
    pick_frequency,
)
from fl_services.shared.core.records import Record
from fl_services.shared.core.reports import DeviceReport
from fl_services.shared.core.tensors import message_of
from fl_services.shared.wire.client_edge import ClientResultHeader

log = logging.getLogger(__name__)

BackendName = Literal["auto", "cpufreq", "emulate"]


class Backend(Protocol):
    @property
    def name(self) -> Literal["emulated", "cpufreq"]: ...

    def apply(self, f_ghz: float, profile: DeviceProfile) -> None: ...

    def restore(self) -> None: ...

    def measured(self, started: float, modelled_s: float) -> float:
        """Device seconds an epoch took: measured (real) or modelled (emulated)."""
        ...


class Emulated:
    """No frequency to set: the device's clock is the model's."""

    name: Literal["emulated"] = "emulated"

    def apply(self, f_ghz: float, profile: DeviceProfile) -> None:
        pass

    def restore(self) -> None:
        pass

    def measured(self, started: float, modelled_s: float) -> float:
        return modelled_s


class CpufreqUnavailable(RuntimeError):
    """The host has no cpufreq policy this process may write."""


class Cpufreq:
    """The host's cpufreq policies under `root` (normally /sys/devices/system/cpu/cpufreq/policy*).

    A profile frequency f is mapped to the same share of the host's top frequency, rounded up to one the
    host lists (so the host never runs slower than the model assumes). Each file it changes is written
    back, as it was, by `restore`."""

    name: Literal["cpufreq"] = "cpufreq"

    def __init__(self, root: Path):
        self.policies = sorted(p for p in root.glob("policy*") if p.is_dir())
        if not self.policies or not all(_control(p) for p in self.policies):
            raise CpufreqUnavailable(f"no writable cpufreq policy under {root}")
        self._saved: dict[Path, str] = {}

    @staticmethod
    def writable(root: Path) -> bool:
        policies = [p for p in root.glob("policy*") if p.is_dir()]
        return bool(policies) and all(_control(p) for p in policies)

    def apply(self, f_ghz: float, profile: DeviceProfile) -> None:
        for policy in self.policies:
            khz = _host_khz(policy, f_ghz / profile.f_max)
            control = _control(policy)
            if control is None:
                raise CpufreqUnavailable(f"{policy} is no longer writable")
            if control == "scaling_setspeed":
                self._write(policy / "scaling_governor", "userspace")
            self._write(policy / control, str(khz))

    def _write(self, path: Path, value: str) -> None:
        if path not in self._saved:
            self._saved[path] = path.read_text().strip()
        path.write_text(value)

    def restore(self) -> None:
        # The frequency before the governor: the userspace governor accepts setspeed only while it rules.
        for path in sorted(self._saved, key=lambda p: p.name == "scaling_governor"):
            try:
                path.write_text(self._saved[path])
            except OSError:
                log.exception("could not restore %s to %r", path, self._saved[path])
        self._saved.clear()

    def measured(self, started: float, modelled_s: float) -> float:
        return time.perf_counter() - started


def _control(policy: Path) -> str | None:
    """The file that sets the policy's frequency: scaling_setspeed if the userspace governor is offered,
    else scaling_max_freq; None if neither is writable by this process."""
    governors = _read(policy / "scaling_available_governors").split()
    setspeed, governor = policy / "scaling_setspeed", policy / "scaling_governor"
    if "userspace" in governors and _writable(setspeed) and _writable(governor):
        return "scaling_setspeed"
    return "scaling_max_freq" if _writable(policy / "scaling_max_freq") else None


def _host_khz(policy: Path, share: float) -> int:
    listed = sorted(int(x) for x in _read(policy / "scaling_available_frequencies").split())
    if not listed:  # drivers without a table (intel_pstate): the range's ends
        listed = [int(_read(policy / "cpuinfo_min_freq")), int(_read(policy / "cpuinfo_max_freq"))]
    target = share * listed[-1]
    return next((k for k in listed if k >= target - 1e-6), listed[-1])


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _writable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.W_OK)


def backend_for(choice: BackendName, cpufreq_root: Path) -> Backend:
    """auto: real cpufreq where the host lets this process write it, otherwise emulation."""
    if choice == "emulate" or (choice == "auto" and not Cpufreq.writable(cpufreq_root)):
        return Emulated()
    return Cpufreq(cpufreq_root)


def record_bytes(record: Record) -> int:
    """What a record weighs on the link (its tensors' bytes; the header is negligible)."""
    return sum(t.numel() * t.element_size() for group in record.values() for t in group.values())


class Pacer:
    """One task's DVFS: installed on the training thread, called before each epoch (see the module)."""

    def __init__(self, config: RunConfig, client_id: int, samples: int, budget_s: float | None,
                 task_bytes: int, backend: Backend):
        self.name, self.profile, self.link_mbps = config.dvfs.device(client_id)
        self.policy = config.dvfs.policy
        self.epochs = config.local.epochs
        self.samples = samples
        self.budget_s = budget_s if self.policy != "max" else None
        self.task_bytes = task_bytes
        self.backend = backend
        self.frequencies: list[float] = []
        self.progress_s = 0.0  # device seconds of the epochs closed so far (measured or modelled)
        self.cycles = 0.0  # their cycles: progress × frequency
        self.compute_s = self.energy_j = 0.0
        self._open: tuple[int, float, float] | None = None  # (epoch, frequency, started)

    def cycles_per_epoch(self) -> float:
        """From measured progress once an epoch is done (the profile's c·|D| before)."""
        done = len(self.frequencies)
        return self.cycles / done if done else self.profile.cycles_per_sample * self.samples

    def before_epoch(self, epoch: int) -> None:
        if self._open is not None and self._open[0] == epoch:
            return  # already opened (the pacer opens epoch 0 itself, for algorithms with no epoch loop)
        self._close(epochs=1)
        f = self._choose(epoch)
        if self.policy != "max":  # no DVFS: the host's frequency is not touched
            self.backend.apply(f, self.profile)
        self._open = (epoch, f, time.perf_counter())

    def _choose(self, epoch: int) -> float:
        if self.budget_s is None:
            return self.profile.f_max
        # The upload is still to come: it is assumed to weigh what the download did.
        left = self.budget_s - self.progress_s - comm_seconds(2 * self.task_bytes, self.link_mbps)
        return pick_frequency(self.profile, self.cycles_per_epoch(), self.epochs - epoch, left)

    def _close(self, epochs: int) -> None:
        if self._open is None:
            return
        _, f, started = self._open
        self._open = None
        modelled = epochs * self.cycles_per_epoch() / (f * GHZ)
        measured = self.backend.measured(started, modelled)
        self.frequencies.extend([f] * epochs)
        self.progress_s += measured
        self.cycles += measured * f * GHZ
        samples = self.cycles_per_epoch() / self.profile.cycles_per_sample  # |D| in the profile's cycles
        self.compute_s += epochs * epoch_seconds(self.profile, samples, f)
        self.energy_j += epochs * epoch_energy(self.profile, samples, f)

    def finish(self, result_bytes: int) -> DeviceReport:
        """Closes the last epoch, counting the epochs the algorithm never announced (an update with no
        epoch loop: FedSGD's one gradient, pFedMe's local rounds) at its frequency."""
        opened = self._open[0] if self._open is not None else self.epochs - 1
        self._close(epochs=max(self.epochs - opened, 1))
        comm = comm_seconds(self.task_bytes + result_bytes, self.link_mbps)
        return DeviceReport(
            backend=self.backend.name, profile=self.name, policy=self.policy, frequencies_ghz=self.frequencies,
            compute_s=self.compute_s, comm_s=comm, energy_j=self.energy_j,
            full_speed_s=self.epochs * self.cycles_per_epoch() / (self.profile.f_max * GHZ) + comm,
            budget_s=self.budget_s,
        )

    @contextlib.contextmanager
    def installed(self) -> Iterator[Pacer]:
        """The pacer on this thread for the task's local update; the host's frequency restored after."""
        token = EPOCH_HOOK.set(self.before_epoch)
        try:
            self.before_epoch(0)
            yield self
        finally:
            EPOCH_HOOK.reset(token)
            self.backend.restore()


def emulated_hold(config: RunConfig, blob: bytes, elapsed_s: float) -> float:
    """Seconds an emulated device's result waits before upload so that its wall time is its modelled
    time × time_scale (0 for real devices, or when the computation already took longer)."""
    scale = config.dvfs.time_scale
    if scale == 0:
        return 0.0
    device = message_of(blob, ClientResultHeader).device
    if device is None or device.backend != "emulated":
        return 0.0
    return max(0.0, (device.compute_s + device.comm_s) * scale - elapsed_s)
