"""One determinism check for the algorithms with server memory: same seed → same run, other seed → not."""
import torch

from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.reference import run_reference


def assert_reference_is_deterministic(config: RunConfig, participants: int, min_accuracy: float) -> None:
    a, b = run_reference(config), run_reference(config)
    c = run_reference(config.model_copy(update={"seed": config.seed + 1}))
    for name in a.global_state:
        assert torch.equal(a.global_state[name], b.global_state[name])
    assert any(not torch.equal(a.global_state[n], c.global_state[n]) for n in a.global_state)
    assert [[r.client_id for r in h.clients] for h in a.history] ==\
        [[r.client_id for r in h.clients] for h in b.history]
    assert all(len(h.clients) == participants for h in a.history)
    assert a.history[-1].test_accuracy > min_accuracy
