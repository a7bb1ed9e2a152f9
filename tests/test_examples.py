"""Every run config shipped under examples/ and docker/ is a valid RunConfig (a typo would be a 422)."""
import json
from pathlib import Path

import pytest

from fl_services.shared.core.algorithms import registry

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted([*ROOT.glob("examples/*.json"), *ROOT.glob("docker/*.json")])


def test_there_are_examples():
    assert any(p.parent.name == "examples" for p in CONFIGS)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_example_config_is_valid(path):
    config = registry.parse_config(json.loads(path.read_text()))
    assert config.name == path.stem
