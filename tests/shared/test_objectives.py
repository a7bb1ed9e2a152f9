"""The teaching quadratic against its closed forms, and NAG against gradient descent on it."""
import itertools
import math

import pytest
import torch

from tests.shared.objectives import gradient_descent, nesterov, quadratic, torch_nesterov

# A = [[4, 1], [1, 3]]: trace 7, det 11, so the eigenvalues solve t² − 7t + 11 = 0: t = (7 ± √5)/2.
M_BY_HAND = (7 + math.sqrt(5)) / 2
M_SMALL_BY_HAND = (7 - math.sqrt(5)) / 2
# A⁻¹ = [[3, −1], [−1, 4]]/11, so A⁻¹b = ([3 − 2], [−1 + 8])/11.
X_STAR = torch.tensor([1 / 11, 7 / 11], dtype=torch.float64)
MU_BY_HAND = (math.sqrt(M_BY_HAND) - math.sqrt(M_SMALL_BY_HAND)) / (math.sqrt(M_BY_HAND) + math.sqrt(M_SMALL_BY_HAND))


def test_constants_by_hand():
    f = quadratic()
    assert f.smoothness == pytest.approx(M_BY_HAND, abs=1e-12)
    assert f.strong_convexity == pytest.approx(M_SMALL_BY_HAND, abs=1e-12)
    assert torch.allclose(f.optimum, X_STAR, atol=1e-15)
    assert f.nesterov_momentum == pytest.approx(MU_BY_HAND, abs=1e-12)


def test_value_and_gradient_by_hand():
    f = quadratic()
    x = torch.tensor([1.0, -2.0], dtype=torch.float64)
    # Ax = [4 − 2, 1 − 6] = [2, −5]; ½xᵀAx = ½(2 + 10) = 6; bᵀx = 1 − 4 = −3.
    assert float(f.value(x)) == pytest.approx(9.0)
    assert torch.equal(f.gradient(x), torch.tensor([1.0, -7.0], dtype=torch.float64))
    assert torch.allclose(f.gradient(X_STAR), torch.zeros(2, dtype=torch.float64), atol=1e-15)
    # f(x*) = −½ bᵀx* = −½ (1/11 + 14/11) = −15/22
    assert float(f.value(X_STAR)) == pytest.approx(-15 / 22, abs=1e-15)


def test_gradient_descent_first_step_by_hand():
    f = quadratic()
    run = gradient_descent(f, tol=1e-8)
    # From 0: ∇f(0) = −b, so x_1 = b/M; the error then contracts by at most 1 − m/M per step.
    first_step = torch.tensor([1.0, 2.0]) / M_BY_HAND
    assert run.distances[1] == pytest.approx(float(torch.linalg.vector_norm(first_step - X_STAR)))
    rate = 1 - M_SMALL_BY_HAND / M_BY_HAND
    for before, after in itertools.pairwise(run.distances):
        assert after <= rate * before * (1 + 1e-9)


def test_classical_nesterov_first_steps_by_hand():
    f = quadratic()
    run = nesterov(f, tol=1e-8)
    A = torch.tensor([[4.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    b = torch.tensor([1.0, 2.0], dtype=torch.float64)
    x0 = torch.zeros(2, dtype=torch.float64)
    x1 = x0 - (A @ x0 - b) / M_BY_HAND  # y_0 = x_0: the first step is a plain gradient step
    y1 = x1 + MU_BY_HAND * (x1 - x0)
    x2 = y1 - (A @ y1 - b) / M_BY_HAND
    assert run.distances[1] == pytest.approx(float(torch.linalg.vector_norm(x1 - X_STAR)), abs=1e-15)
    assert run.distances[2] == pytest.approx(float(torch.linalg.vector_norm(x2 - X_STAR)), abs=1e-15)


def test_torch_nesterov_walks_the_classical_look_ahead_points():
    """torch's p_k equals the classical y_k = x_k + μ(x_k − x_{k−1}) (change of variables)."""
    f = quadratic()
    A = torch.tensor([[4.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    b = torch.tensor([1.0, 2.0], dtype=torch.float64)
    x_prev = x = torch.zeros(2, dtype=torch.float64)
    looks = []
    for _ in range(12):
        y = x + MU_BY_HAND * (x - x_prev)
        looks.append(float(torch.linalg.vector_norm(y - X_STAR)))
        x_prev, x = x, y - (A @ y - b) / M_BY_HAND
    run = torch_nesterov(f, tol=0.0, max_iter=11)
    assert run.distances == pytest.approx(looks, abs=1e-13)


def test_nesterov_needs_fewer_iterations_than_gradient_descent():
    f = quadratic()
    gd, nag, sgd_nesterov = gradient_descent(f), nesterov(f), torch_nesterov(f)
    assert gd.converged and nag.converged and sgd_nesterov.converged
    for run in (gd, nag, sgd_nesterov):
        assert float(torch.linalg.vector_norm(run.x - X_STAR)) < 1e-8
    # Measured: GD 25, classical NAG 16, torch SGD(nesterov=True) 16 iterations from x_0 = 0.
    assert (gd.iterations, nag.iterations, sgd_nesterov.iterations) == (25, 16, 16)
    assert nag.iterations < gd.iterations and sgd_nesterov.iterations < gd.iterations


def test_gd_iteration_count_matches_the_contraction_bound():
    # On a quadratic, GD with step 1/M contracts the slowest eigen-direction by exactly 1 − m/M, so it
    # needs about log(tol/‖x0 − x*‖)/log(1 − m/M) steps (≈ 24.8 here): 25 once rounded up.
    f = quadratic()
    bound = math.log(1e-8 / float(torch.linalg.vector_norm(X_STAR))) / math.log(1 - M_SMALL_BY_HAND / M_BY_HAND)
    assert gradient_descent(f).iterations == math.ceil(bound)


def test_rejects_a_non_convex_quadratic():
    with pytest.raises(ValueError, match="positive definite"):
        quadratic(A=((1.0, 2.0), (2.0, 1.0)))
    with pytest.raises(ValueError, match="symmetric"):
        quadratic(A=((1.0, 2.0), (0.0, 1.0)))
