"""The cloud's compute device (FL_CLOUD_DEVICE): the CPU by default; one this machine lacks stops the cloud."""
import pytest
import torch
from pydantic import ValidationError

from fl_services.cloud.config import CloudSettings
from fl_services.shared.runtime.settings import load_settings


def test_device_defaults_to_the_cpu_and_refuses_what_this_machine_lacks(clean_env, monkeypatch):
    assert CloudSettings().compute_device == torch.device("cpu")
    with pytest.raises(ValidationError, match="device must be auto, cpu, cuda or cuda:N, got 'cuda1'"):
        CloudSettings(device="cuda1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    clean_env.setenv("FL_CLOUD_DEVICE", "auto")
    assert CloudSettings().compute_device == torch.device("cpu")
    clean_env.setenv("FL_CLOUD_DEVICE", "cuda")
    with pytest.raises(SystemExit, match="^invalid settings: FL_CLOUD_DEVICE: device 'cuda': CUDA is not available "
                                         "on this machine"):
        load_settings(CloudSettings)
