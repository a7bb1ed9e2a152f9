"""DVFS maths: device profiles, the time and energy of a local epoch, and the frequency a policy picks.

The standard model of Tran et al. (INFOCOM 2019, "Federated learning over wireless networks:
optimization model design and analysis") and Yang et al. (IEEE TWC 2021, "Energy efficient federated
learning over wireless communication networks"): a client with |D| samples, c CPU cycles per sample and
effective switched capacitance α running at frequency f needs per local epoch

    T = c·|D| / f                 seconds of computation,
    E = (α/2)·c·|D|·f²            joules of dynamic energy (dynamic power (α/2)·f³ for T seconds),

to which we add the static (leakage) power of the busy core times T. Communication takes bytes·8 / rate.
Everything here is plain arithmetic on floats (no torch): the run config validates against it, the
client paces its epochs with it, the edge computes deadlines with it.

The epoch hook (`before_epoch`) is how every algorithm's epoch loop reaches the client's pacer without
knowing about it: the client sets `EPOCH_HOOK` on its training thread; elsewhere (the reference runner,
the cloud) it is unset and the call does nothing.
"""
from __future__ import annotations

from contextvars import ContextVar
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

GHZ = 1e9
Policy = Literal["max", "deadline", "slack"]


def check_frequencies(freqs: tuple[float, ...]) -> tuple[float, ...]:
    """A frequency list as the model keeps it: ascending, distinct, each within [0.01, 10] GHz."""
    if any(not 0.01 <= f <= 10 for f in freqs):
        raise ValueError(f"frequencies must lie in [0.01, 10] GHz, got {list(freqs)}")
    return tuple(sorted(set(freqs)))


class DeviceProfile(BaseModel):
    """One device's CPU as the energy model sees it (a busy core: local training is single-threaded)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    frequencies_ghz: tuple[float, ...] = Field(
        min_length=1, max_length=64, description="the frequencies cpufreq lists (scaling_available_frequencies)")
    cycles_per_sample: float = Field(gt=0, le=1e12, description="c: CPU cycles to train on one sample once")
    capacitance: float = Field(gt=0, le=1e-20, description="α: effective switched capacitance (E = α/2·c·|D|·f²)")
    static_power_w: float = Field(0.0, ge=0, le=1000, description="leakage power of the busy core, watts")
    source: str = Field("", max_length=2000, description="where the figures come from")

    @field_validator("frequencies_ghz")
    @classmethod
    def _ascending(cls, freqs: tuple[float, ...]) -> tuple[float, ...]:
        return check_frequencies(freqs)

    @property
    def f_max(self) -> float:
        return self.frequencies_ghz[-1]


# A72 cycles per sample of the default CNN on MNIST (forward + backward, batch 32). Measured on this
# project's host, one torch thread on an AMD EPYC at 2.45 GHz: 0.57 ms per sample, 1.4e6 cycles; times 4
# for the A72 (128-bit NEON against AVX2's 256 bit, a narrower core): an assumption, which a run
# overrides per client with measured figures. Other cores scale it by their Dhrystone rating against
# the A72 (ARM's DMIPS/MHz: A72 4.72, A57 4.1, A15 3.5, A53 2.3, A7 1.9): a slower core needs more
# cycles for the same work.
_A72_CYCLES = 5.6e6


def _cycles(dmips_per_mhz: float) -> float:
    return round(_A72_CYCLES * 4.72 / dmips_per_mhz, -4)


def _capacitance(dynamic_w: float, f_max_ghz: float) -> float:
    """α from a core's dynamic power at its top frequency: P = (α/2)·f³."""
    return 2 * dynamic_w / (f_max_ghz * GHZ) ** 3


def _steps(lo_mhz: int, hi_mhz: int, step_mhz: int = 100) -> tuple[float, ...]:
    return tuple(mhz / 1000 for mhz in range(lo_mhz, hi_mhz + 1, step_mhz))


def _stepped(board: str, driver: str, lo_mhz: int, hi_mhz: int, dmips_per_mhz: float, core_w: float,
             static_w: float, note: str = "") -> DeviceProfile:
    """A board whose cpufreq driver lists lo..hi MHz in 100 MHz steps, its busy core drawing `core_w` watts at
    the top one."""
    top = hi_mhz / 1000
    return DeviceProfile(
        frequencies_ghz=_steps(lo_mhz, hi_mhz), cycles_per_sample=_cycles(dmips_per_mhz),
        capacitance=_capacitance(core_w, top), static_power_w=static_w,
        source=f"{board}: {driver} lists {lo_mhz}-{hi_mhz} MHz in 100 MHz steps; ~{core_w:g} W per loaded core at "
               f"{top:g} GHz{note}")


# Named profiles. Frequency lists are what each board's cpufreq driver lists; the powers are per-core
# figures at the top frequency, approximate (board power under load minus idle, per loaded core, as
# published board reviews and the vendors' power guides report them): good to an order of magnitude,
# which is what the model needs to rank policies. Overrides in the run config replace any field.
PROFILES: dict[str, DeviceProfile] = {
    "rpi4": _stepped("Raspberry Pi 4 B (BCM2711, Cortex-A72)", "raspberrypi-cpufreq", 600, 1500, 4.72, 1.0, 0.15,
                     " (≈ 6.4 W loaded vs 2.7 W idle over 4 cores)"),
    "rpi-zero-2w": _stepped("Raspberry Pi Zero 2 W (RP3A0, Cortex-A53)", "raspberrypi-cpufreq", 600, 1000, 2.3, 0.35,
                            0.05),
    "jetson-nano": DeviceProfile(
        frequencies_ghz=(0.102, 0.204, 0.3072, 0.4032, 0.5184, 0.6144, 0.7104, 0.8256, 0.9216, 1.0368,
                         1.1328, 1.224, 1.326, 1.428, 1.479),
        cycles_per_sample=_cycles(4.1), capacitance=_capacitance(0.75, 1.479), static_power_w=0.1,
        source="NVIDIA Jetson Nano (Tegra X1, Cortex-A57): tegra210 cpufreq table, 102-1479 MHz; ~0.75 W per "
               "loaded core at 1.479 GHz (10 W mode)"),
    "odroid-xu4-a15": _stepped("ODROID-XU4 (Exynos 5422) big cluster, Cortex-A15", "exynos cpufreq", 200, 2000, 3.5,
                               1.4, 0.2),
    "odroid-xu4-a7": _stepped("ODROID-XU4 (Exynos 5422) LITTLE cluster, Cortex-A7", "exynos cpufreq", 200, 1400, 1.9,
                              0.25, 0.03),
}
DEFAULT_PROFILE = "rpi4"


# ---- the model ------------------------------------------------------------------------------------
def epoch_seconds(profile: DeviceProfile, samples: float, f_ghz: float) -> float:
    """T = c·|D| / f."""
    return profile.cycles_per_sample * samples / (f_ghz * GHZ)


def epoch_energy(profile: DeviceProfile, samples: float, f_ghz: float) -> float:
    """E = (α/2)·c·|D|·f² + static power × T, joules."""
    dynamic = profile.capacitance / 2 * profile.cycles_per_sample * samples * (f_ghz * GHZ) ** 2
    return dynamic + profile.static_power_w * epoch_seconds(profile, samples, f_ghz)


def comm_seconds(num_bytes: int, link_mbps: float) -> float:
    return num_bytes * 8 / (link_mbps * 1e6)


def pick_frequency(profile: DeviceProfile, cycles_per_epoch: float, epochs_left: int,
                   seconds_left: float | None) -> float:
    """The frequency for the next epoch: of those that finish the `epochs_left` epochs of
    `cycles_per_epoch` within `seconds_left`, the one spending the least energy per epoch (the lowest,
    unless static power makes a slightly faster one cheaper: below f* = (P_s/α)^(1/3) leakage over the
    longer time outweighs the dynamic saving). None (no deadline known) or no feasible one: the top."""
    if seconds_left is None:
        return profile.f_max
    samples_equiv = cycles_per_epoch / profile.cycles_per_sample  # |D| in the profile's own cycles
    # A relative 1e-9 of slack: a budget met exactly must not fail on float rounding of the progress so far.
    feasible = [f for f in profile.frequencies_ghz
                if epochs_left * cycles_per_epoch / (f * GHZ) <= seconds_left * (1 + 1e-9)]
    if not feasible:
        return profile.f_max
    return min(feasible, key=lambda f: (epoch_energy(profile, max(samples_equiv, 1e-12), f), f))


def paced_seconds(profile: DeviceProfile, samples: float, epochs: int, budget_s: float | None) -> float:
    """A device's modelled compute time for `epochs` epochs of `samples` when each epoch runs at the frequency
    `pick_frequency` gives it within what is left of `budget_s` (None: the top frequency)."""
    cycles, elapsed = profile.cycles_per_sample * samples, 0.0
    for epoch in range(epochs):
        f = pick_frequency(profile, cycles, epochs - epoch, None if budget_s is None else budget_s - elapsed)
        elapsed += cycles / (f * GHZ)
    return elapsed


# ---- the epoch hook ---------------------------------------------------------------------------------
EPOCH_HOOK: ContextVar[Callable[[int], None] | None] = ContextVar("dvfs_epoch_hook", default=None)


def before_epoch(epoch: int) -> None:
    """Called by every local epoch loop before epoch `epoch` (0-based): the client picks its frequency
    there. A no-op unless the client's pacer is installed on this thread."""
    hook = EPOCH_HOOK.get()
    if hook is not None:
        hook(epoch)
