"""`fedctl create --help` as an operator runs it: the model and data fields with their defaults."""
import os
import subprocess
import sys

from fl_services.fedctl.launch import ROOT


def create_help() -> str:
    """`fedctl create --help` as one line of words (rich's box drawing and wrapping taken out)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    out = subprocess.run([sys.executable, "-m", "fl_services.fedctl", "create", "--help"], cwd=ROOT, env=env,
                         check=True,                          capture_output=True, text=True).stdout
    return " ".join(out.replace("│", " ").split())


def test_create_help_documents_the_client_holdout_and_imported_code():
    text = create_help()
    assert "data.client_holdout = 0.2: share of each client's rows held out as its own test split" in text
    assert "0: every row trains" in text
    assert "model.hidden = [200, 200]" in text
    assert "'package.module:factory'" in text and "'package.module:load'" in text


def test_create_help_documents_the_dvfs_policies_and_profiles():
    text = create_help()
    assert 'dvfs.policy = "max": max: no DVFS, full speed | deadline:' in text
    assert 'dvfs.profile = "rpi4": every client\'s device profile: rpi4 | rpi-zero-2w | jetson-nano' in text
    assert "dvfs.time_scale = 0.0: emulated devices" in text
    assert "client k gets the one at position k mod n" in text
