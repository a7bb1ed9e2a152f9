import torch
import torch.nn.functional as F

from shared.config import LocalTrainingConfig
from shared.data.datasets import ArrayDataset
from shared.training import batches, local_sgd


def test_batch_size_zero_is_one_full_batch():
    assert [b.tolist() for b in batches(5, 0, torch.Generator())] == [[0, 1, 2, 3, 4]]
    parts = batches(10, 3, torch.Generator().manual_seed(0))
    assert [len(b) for b in parts] == [3, 3, 3, 1] and sorted(torch.cat(parts).tolist()) == list(range(10))


def test_nesterov_matches_torch_semantics_by_hand():
    """buf ← μ·buf + g (buf = g at the first step); w ← w − lr·(g + μ·buf); buffer fresh each call."""
    torch.manual_seed(0)
    data = ArrayDataset(torch.randn(8, 3), torch.tensor([0, 1, 0, 1, 1, 0, 1, 0]))
    cfg = LocalTrainingConfig(epochs=3, batch_size=0, lr=0.1, optimizer="nesterov", momentum=0.9)
    model = torch.nn.Linear(3, 2)
    w0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    for _ in range(2):  # two "rounds": each must start with an empty momentum buffer
        for n, p in model.named_parameters():
            p.data.copy_(w0[n])
        local_sgd(model, data, cfg, torch.Generator())
    w, b = w0["weight"].clone(), w0["bias"].clone()
    buf = None
    for _ in range(3):
        w.requires_grad_(True), b.requires_grad_(True)
        loss = F.cross_entropy(data.x @ w.T + b, data.y)
        gw, gb = torch.autograd.grad(loss, [w, b])
        buf = (gw, gb) if buf is None else (0.9 * buf[0] + gw, 0.9 * buf[1] + gb)
        w = (w - 0.1 * (gw + 0.9 * buf[0])).detach()
        b = (b - 0.1 * (gb + 0.9 * buf[1])).detach()
    assert torch.allclose(model.weight, w, atol=1e-6) and torch.allclose(model.bias, b, atol=1e-6)
