"""The DVFS model: T = c·|D|/f, E = (α/2)·c·|D|·f² + P_s·T, and the frequency a deadline allows."""
import pytest

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.dvfs import (
    PROFILES,
    DeviceProfile,
    comm_seconds,
    epoch_energy,
    epoch_seconds,
    pick_frequency,
)

DEVICE = DeviceProfile(frequencies_ghz=(2.0, 0.5, 1.0), cycles_per_sample=1e6, capacitance=2e-28)


def test_time_and_energy_follow_the_standard_model():
    # c·|D| = 1e6 · 100 = 1e8 cycles; at 1 GHz: 0.1 s; (α/2)·c·|D|·f² = 1e-28 · 1e8 · 1e18 = 0.01 J.
    assert epoch_seconds(DEVICE, 100, 1.0) == pytest.approx(0.1)
    assert epoch_energy(DEVICE, 100, 1.0) == pytest.approx(0.01)
    assert epoch_energy(DEVICE, 100, 2.0) == pytest.approx(0.04)  # twice the speed, four times the energy
    leaky = DEVICE.model_copy(update={"static_power_w": 0.5})
    assert epoch_energy(leaky, 100, 1.0) == pytest.approx(0.01 + 0.5 * 0.1)
    assert comm_seconds(2_500_000, 20.0) == pytest.approx(1.0)  # 20 Mbit at 20 Mbit/s


def test_frequencies_are_kept_ascending_and_the_top_is_the_last():
    assert DEVICE.frequencies_ghz == (0.5, 1.0, 2.0) and DEVICE.f_max == 2.0


@pytest.mark.parametrize(("seconds_left", "expected"), [
    (None, 2.0),   # no deadline known: full speed
    (10.0, 0.5),   # plenty of time: the lowest
    (0.35, 1.0),   # 3 epochs of 1e8 cycles: 0.6 s at 0.5 GHz, 0.3 s at 1 GHz
    (0.15, 2.0),   # only the top finishes (0.15 s)
    (0.01, 2.0),   # nothing finishes: the top, to be as little late as possible
])
def test_the_deadline_frequency_is_the_slowest_that_finishes(seconds_left, expected):
    assert pick_frequency(DEVICE, 1e8, 3, seconds_left) == expected


def test_static_power_keeps_the_frequency_above_its_energy_optimum():
    # With P_s = 1 W, E(f)·(1/(c|D|)) = 1e-28 f² + 1/f: the optimum f* = (P_s/α)^(1/3) ≈ 1.7 GHz.
    leaky = DEVICE.model_copy(update={"static_power_w": 1.0})
    assert pick_frequency(leaky, 1e8, 1, 10.0) == 2.0
    assert epoch_energy(leaky, 100, 2.0) < epoch_energy(leaky, 100, 0.5)


def test_every_named_profile_is_sourced_and_fast_enough_to_matter():
    for name, p in PROFILES.items():
        assert p.source, name
        # the top frequency's dynamic power lies in 0.1..5 W per core, as the sources say
        assert 0.1 < p.capacitance / 2 * (p.f_max * 1e9) ** 3 < 5, name
    speeds = {name: p.f_max / p.cycles_per_sample for name, p in PROFILES.items()}
    assert max(speeds.values()) / min(speeds.values()) >= 3  # the benchmark's spread is available


def test_per_client_devices_cycle_profiles_and_apply_overrides():
    config = RunConfig.model_validate({"dvfs": {
        "profiles": ["rpi4", "odroid-xu4-a7"], "link_mbps": 10,
        "clients": {"3": {"cycles_per_sample": 1e6, "link_mbps": 5}, "4": {"profile": "jetson-nano"}}}})
    assert config.dvfs.device(0) == ("rpi4", PROFILES["rpi4"], 10)
    assert config.dvfs.device(1) == ("odroid-xu4-a7", PROFILES["odroid-xu4-a7"], 10)
    name, profile, link = config.dvfs.device(3)
    assert (name, profile.cycles_per_sample, profile.f_max, link) == ("odroid-xu4-a7*", 1e6, 1.4, 5)
    assert config.dvfs.device(4) == ("jetson-nano", PROFILES["jetson-nano"], 10)
    assert RunConfig().dvfs.policy == "max"  # no DVFS unless asked
