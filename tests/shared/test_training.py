import pytest
import torch
import torch.nn.functional as F

from fl_services.shared.core.config import LocalTrainingConfig
from fl_services.shared.core.data import ArrayDataset
from fl_services.shared.core.training import (
    CPU_EVALUATION_BATCH,
    DpSgd,
    Proximal,
    Sgd,
    batches,
    evaluate,
    local_sgd,
    make_optimizer,
    minibatches,
)


def test_batch_size_zero_is_one_full_batch():
    assert [b.tolist() for b in batches(5, 0, torch.Generator())] == [[0, 1, 2, 3, 4]]
    parts = batches(10, 3, torch.Generator().manual_seed(0))
    assert [len(b) for b in parts] == [3, 3, 3, 1] and sorted(torch.cat(parts).tolist()) == list(range(10))


def test_minibatches_are_the_rows_of_batches_in_their_order():
    data = ArrayDataset(torch.randn(10, 4), torch.arange(10))
    for batch_size in (3, 0, 10):
        expected = [(data.x[idx], data.y[idx]) for idx in batches(10, batch_size, torch.Generator().manual_seed(2))]
        got = list(minibatches(data, batch_size, torch.Generator().manual_seed(2)))
        assert len(got) == len(expected)
        assert all(torch.equal(x, ex) and torch.equal(y, ey) for (x, y), (ex, ey) in zip(got, expected, strict=True))


@pytest.mark.parametrize("optimizer", ["sgd", "nesterov"])
def test_sgd_steps_as_torchs_sgd_bit_for_bit(optimizer):
    """Sgd against make_optimizer's torch SGD, step by step: a parameter the loss reaches at every step, one it
    reaches at every other step (no gradient, so no step and its momentum buffer kept in between), one never."""
    cfg = LocalTrainingConfig(lr=0.05, optimizer=optimizer, momentum=0.8)
    torch.manual_seed(0)
    start = [torch.randn(3, 2), torch.randn(2), torch.randn(4)]
    x = torch.randn(5, 3)
    ours, theirs = ([torch.nn.Parameter(t.clone()) for t in start] for _ in range(2))
    sgd, torch_sgd = Sgd(ours, cfg), make_optimizer(theirs, cfg)
    for step in range(6):
        for params, opt in ((ours, sgd), (theirs, torch_sgd)):
            opt.zero_grad()
            loss = (x @ params[0]).square().mean()
            if step % 2 == 0:
                loss = loss + (params[0].sum(0) * params[1]).sum()
            loss.backward()
            opt.step()
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True)), step
    assert torch.equal(ours[2], start[2]) and not torch.equal(ours[1], start[1])


def test_sgd_refuses_nesterov_without_momentum_as_torch_does():
    cfg = LocalTrainingConfig(optimizer="nesterov", momentum=0.0)
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum") as torchs:
        make_optimizer([torch.nn.Parameter(torch.zeros(1))], cfg)
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum") as ours:
        Sgd([torch.nn.Parameter(torch.zeros(1))], cfg)
    assert str(ours.value) == str(torchs.value)


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


def digits_like(n: int = 32) -> ArrayDataset:
    g = torch.Generator().manual_seed(1)
    return ArrayDataset(torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g))


def trained(dp_sgd: DpSgd | None, seed: int = 0, cfg: LocalTrainingConfig | None = None) -> dict[str, torch.Tensor]:
    """A small MLP's weights after local_sgd (cfg None: untrained)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    if cfg is not None:
        local_sgd(model, digits_like(), cfg, torch.Generator().manual_seed(seed), dp_sgd=dp_sgd)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_dp_sgd_without_clipping_or_noise_is_plain_sgd():
    """Per-example gradients (opacus) summed over full batches and divided by B are the batch's mean gradient.
    (One epoch: the noise is drawn from the batch order's generator, so later epochs' orders differ.)"""
    cfg = LocalTrainingConfig(epochs=1, batch_size=8, lr=0.1)
    plain, private = trained(None, cfg=cfg), trained(DpSgd(noise_multiplier=1e-15, clip_norm=1e6), cfg=cfg)
    assert all(torch.allclose(private[name], plain[name], atol=1e-5) for name in plain)


def test_dp_sgd_moves_each_step_by_at_most_lr_times_the_clip_norm_and_noise_comes_from_the_generator():
    cfg = LocalTrainingConfig(epochs=1, batch_size=0, lr=1.0)  # one step over the whole batch
    start = trained(None)
    plain = trained(None, cfg=cfg)
    clipped = trained(DpSgd(noise_multiplier=1e-15, clip_norm=0.01), cfg=cfg)

    def step(after: dict[str, torch.Tensor]) -> float:
        return float(torch.cat([(after[n] - start[n]).flatten() for n in start]).norm())

    assert step(plain) > 0.1 and step(clipped) <= 0.01 + 1e-6
    noised = [trained(DpSgd(noise_multiplier=1.0, clip_norm=1.0), s, LocalTrainingConfig(epochs=2, batch_size=8))
              for s in (0, 0, 1)]
    assert all(torch.equal(noised[0][n], noised[1][n]) for n in start)
    assert not all(torch.equal(noised[0][n], noised[2][n]) for n in start)


def test_dp_sgd_refuses_a_proximal_term():
    model = torch.nn.Linear(6, 3)
    with pytest.raises(ValueError, match="neither a proximal term"):
        local_sgd(model, digits_like(), LocalTrainingConfig(), torch.Generator(),
                  proximal=Proximal({n: p.detach().clone() for n, p in model.named_parameters()}, 1.0),
                  dp_sgd=DpSgd(1.0, 1.0))


def test_an_evaluation_in_batches_counts_every_row_once_with_the_figures_of_one_batch():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 4))
    rows = 3 * CPU_EVALUATION_BATCH + 5  # a short last batch
    data = ArrayDataset(torch.randn(rows, 1, 4, 4), torch.randint(0, 4, (rows,)))
    batched, whole = evaluate(model, data), evaluate(model, data, batch_size=rows)
    logits = model(data.x).detach()
    assert batched.samples == whole.samples == rows
    assert batched.accuracy == whole.accuracy == int((logits.argmax(1) == data.y).sum()) / rows
    assert batched.loss == pytest.approx(whole.loss, rel=1e-6)
    assert whole.loss == pytest.approx(float(F.cross_entropy(logits, data.y)), rel=1e-6)
