"""DVFS on the client: the real cpufreq backend against a sysfs tree in a temporary directory, the pacer's
choices from measured progress, and a whole task computed under each policy."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fl_services.client.config import ClientSettings
from fl_services.client.dvfs import Cpufreq, CpufreqUnavailable, Emulated, Pacer, backend_for, emulated_hold
from fl_services.client.worker import compute
from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.data import load_client
from fl_services.shared.core.dvfs import PROFILES
from fl_services.shared.core.federation import initial_model, local_job
from fl_services.shared.core.records import decode
from fl_services.shared.wire.client_edge import ClientResultHeader, ClientTaskHeader

HOST_KHZ = "408000 600000 816000 1008000 1200000 1416000 1608000 1800000"


def cpufreq_tree(root: Path, policies: int = 2, userspace: bool = True) -> Path:
    """What /sys/devices/system/cpu/cpufreq looks like on an ARM board (files only: a tmp dir is no sysfs)."""
    for i in range(policies):
        p = root / f"policy{i * 4}"
        p.mkdir(parents=True)
        (p / "scaling_available_frequencies").write_text(HOST_KHZ + " \n")
        (p / "scaling_available_governors").write_text(
            ("conservative userspace powersave ondemand performance schedutil" if userspace else "performance") + "\n")
        (p / "scaling_governor").write_text("schedutil\n")
        (p / "scaling_max_freq").write_text("1800000\n")
        (p / "cpuinfo_max_freq").write_text("1800000\n")
        (p / "cpuinfo_min_freq").write_text("408000\n")
        if userspace:
            (p / "scaling_setspeed").write_text("<unsupported>\n")
    return root


def read(root: Path, name: str) -> list[str]:
    return [(p / name).read_text().strip() for p in sorted(root.glob("policy*"))]


def test_cpufreq_sets_the_userspace_speed_and_restores_the_governor(tmp_path):
    root = cpufreq_tree(tmp_path)
    backend = Cpufreq(root)
    rpi4 = PROFILES["rpi4"]
    backend.apply(0.6, rpi4)  # 0.6/1.5 of the top: 720 MHz on this host → the next listed, 816 MHz
    assert read(root, "scaling_governor") == ["userspace"] * 2
    assert read(root, "scaling_setspeed") == ["816000"] * 2
    backend.apply(1.5, rpi4)
    assert read(root, "scaling_setspeed") == ["1800000"] * 2
    backend.restore()
    assert read(root, "scaling_governor") == ["schedutil"] * 2
    assert read(root, "scaling_setspeed") == ["<unsupported>"] * 2


def test_cpufreq_without_userspace_caps_scaling_max_freq(tmp_path):
    root = cpufreq_tree(tmp_path, userspace=False)
    backend = Cpufreq(root)
    backend.apply(1.0, PROFILES["rpi4"])  # 1.2 GHz on this host
    assert read(root, "scaling_max_freq") == ["1200000"] * 2
    assert read(root, "scaling_governor") == ["schedutil"] * 2
    backend.restore()
    assert read(root, "scaling_max_freq") == ["1800000"] * 2


def test_auto_uses_cpufreq_where_writable_and_emulates_where_missing(tmp_path):
    assert isinstance(backend_for("auto", tmp_path / "none"), Emulated)
    assert isinstance(backend_for("emulate", cpufreq_tree(tmp_path / "rw")), Emulated)
    assert isinstance(backend_for("auto", tmp_path / "rw"), Cpufreq)
    with pytest.raises(CpufreqUnavailable, match="no writable cpufreq policy"):
        backend_for("cpufreq", tmp_path / "none")


def test_auto_emulates_where_cpufreq_is_read_only(tmp_path):
    root = cpufreq_tree(tmp_path / "ro")
    for f in root.glob("policy*/*"):
        f.chmod(0o444)
    if Cpufreq.writable(root):  # root ignores file modes
        pytest.skip("running as root: a read-only file is writable all the same")
    assert isinstance(backend_for("auto", root), Emulated)


def deadline_config(**dvfs) -> RunConfig:
    return RunConfig(local={"epochs": 4}, dvfs={"policy": "deadline", **dvfs})


def test_the_pacer_slows_down_to_the_budget_and_reports_the_model():
    config = deadline_config()
    rpi4 = PROFILES["rpi4"]
    per_epoch_at_top = rpi4.cycles_per_sample * 300 / 1.5e9
    pacer = Pacer(config, 0, samples=300, budget_s=8 * per_epoch_at_top, task_bytes=0, backend=Emulated())
    with pacer.installed():
        for epoch in range(4):
            pacer.before_epoch(epoch)
    report = pacer.finish(result_bytes=0)
    # 4 epochs in twice their top-speed time: 0.75 GHz would do, 0.8 is the cheapest listed; the last epoch
    # spends the time the first three saved.
    assert report.frequencies_ghz == [0.8, 0.8, 0.8, 0.7]
    times = [per_epoch_at_top * 1.5 / f for f in report.frequencies_ghz]
    assert report.compute_s == pytest.approx(sum(times)) and report.compute_s <= report.budget_s
    assert report.full_speed_s == pytest.approx(4 * per_epoch_at_top)
    dynamic = [rpi4.capacitance / 2 * rpi4.cycles_per_sample * 300 * (f * 1e9) ** 2 for f in report.frequencies_ghz]
    assert report.energy_j == pytest.approx(sum(dynamic) + rpi4.static_power_w * sum(times))


class SlowHost(Emulated):
    """A device whose epochs take 1.5× what its profile says, as measured progress would show."""

    def measured(self, started: float, modelled_s: float) -> float:
        return 1.5 * modelled_s


def test_the_pacer_speeds_up_when_measured_progress_lags_the_model():
    rpi4 = PROFILES["rpi4"]
    per_epoch_at_top = rpi4.cycles_per_sample * 300 / 1.5e9
    budget = 4 * per_epoch_at_top * 1.5 / 0.8
    frequencies = {}
    for backend in (Emulated(), SlowHost()):
        pacer = Pacer(deadline_config(), 0, samples=300, budget_s=budget, task_bytes=0, backend=backend)
        with pacer.installed():
            for epoch in range(4):
                pacer.before_epoch(epoch)
        frequencies[type(backend).__name__] = pacer.finish(0).frequencies_ghz
    assert frequencies["Emulated"] == [0.8] * 4
    slow = frequencies["SlowHost"]
    assert slow[0] == 0.8 and slow[-1] > 0.8  # after measuring the first epoch, it catches up


def test_max_never_touches_cpufreq(tmp_path):
    root = cpufreq_tree(tmp_path)
    pacer = Pacer(RunConfig(), 0, samples=100, budget_s=1e6, task_bytes=0, backend=Cpufreq(root))
    with pacer.installed():
        pacer.before_epoch(0)
    assert pacer.finish(0).frequencies_ghz == [1.5]
    assert read(root, "scaling_governor") == ["schedutil"] * 2
    assert read(root, "scaling_setspeed") == ["<unsupported>"] * 2


def task_of(config: RunConfig, budget_s: float | None = None):
    algorithm = registry.create(config)
    task = algorithm.init_global(initial_model(config))
    header = ClientTaskHeader(task_id="t-0", run_id="r", client_id=1, round=0, version=0, config=config,
                              budget_s=budget_s)
    return algorithm, header, task


def test_flat_fedavg_under_max_is_bit_for_bit_the_update_without_dvfs(tmp_path):
    config = RunConfig(model={"name": "mlp"}, local={"epochs": 2})
    algorithm, header, task = task_of(config)
    blob = compute(ClientSettings(state_dir=tmp_path, dvfs_backend="emulate"), header, task)
    tensors, result = decode(blob, ClientResultHeader)
    data = load_client(config.data, config.seed, 1)
    plain = algorithm.local_update(local_job(config, 1, 0, data), task, {})  # no pacer installed
    assert tensors.keys() == plain.tensors.keys()
    for group in plain.tensors:
        for name, value in plain.tensors[group].items():
            assert torch.equal(tensors[group][name], value), (group, name)
    assert result.loss == plain.loss
    assert result.device is not None and result.device.frequencies_ghz == [1.5, 1.5]
    assert result.device.policy == "max" and result.device.backend == "emulated"


def test_a_task_under_deadline_drives_the_real_cpufreq_before_each_epoch(tmp_path, monkeypatch):
    """compute() with the cpufreq backend on a fake tree: what each epoch found written in scaling_setspeed."""
    root = cpufreq_tree(tmp_path / "sys")
    config = RunConfig(model={"name": "mlp"}, local={"epochs": 3}, dvfs={"policy": "deadline"})
    _, header, task = task_of(config, budget_s=1e4)  # a generous budget: the lowest frequency
    seen: list[list[str]] = []
    import fl_services.shared.core.training as training

    original = training.before_epoch

    def spy(epoch: int) -> None:
        original(epoch)
        seen.append(read(root, "scaling_setspeed"))

    monkeypatch.setattr(training, "before_epoch", spy)
    settings = ClientSettings(state_dir=tmp_path / "state", dvfs_backend="cpufreq", cpufreq_root=root)
    _, result = decode(compute(settings, header, task), ClientResultHeader)
    assert seen == [["816000"] * 2] * 3  # 0.6 of the rpi4's 1.5 GHz → 0.72 of 1.8 → 816 MHz listed
    assert result.device is not None and result.device.backend == "cpufreq"
    assert result.device.frequencies_ghz == [0.6] * 3
    assert read(root, "scaling_governor") == ["schedutil"] * 2  # restored after the task


def test_an_emulated_result_is_held_to_its_modelled_time_times_the_scale(tmp_path):
    config = RunConfig(model={"name": "mlp"}, dvfs={"time_scale": 0.5})
    _, header, task = task_of(config)
    blob = compute(ClientSettings(state_dir=tmp_path, dvfs_backend="emulate"), header, task)
    _, result = decode(blob, ClientResultHeader)
    assert result.device is not None
    modelled = result.device.compute_s + result.device.comm_s
    assert emulated_hold(config, blob, elapsed_s=0.1) == pytest.approx(modelled * 0.5 - 0.1)
    assert emulated_hold(config, blob, elapsed_s=modelled) == 0.0
    assert emulated_hold(RunConfig(model={"name": "mlp"}), blob, elapsed_s=0.0) == 0.0  # scale 0: no stretching
