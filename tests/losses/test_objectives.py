"""The objectives of PPO and A2C: each term's gradient equals autograd of its loss, on torch
tensors and NumPy arrays alike, and an objective's losses and gradients are the same numbers
on both array libraries."""

import numpy as np
import pytest
import torch

from shoal.algos.cores.rollout_batch import RolloutBatch
from shoal.losses.objectives import (
    ClippedSurrogate,
    EntropyBonus,
    KLPenalty,
    Objective,
    PolicyGradient,
    PolicyOutputs,
    Targets,
    ValueRegression,
    a2c_objective,
    ppo_objective,
    standardize,
)

TERMS = {
    "clipped surrogate": ClippedSurrogate(0.2),
    "policy gradient": PolicyGradient(),
    "value": ValueRegression(),
    "clipped value": ValueRegression(clip=0.3),
    "entropy": EntropyBonus(),
    "kl penalty": KLPenalty(0.7),
}

OBJECTIVES = {
    "ppo": ppo_objective(0.2, 0.5, 0.01),
    "ppo clipped value, kl penalty": ppo_objective(0.1, 1.0, 0.0, value_clip=0.2, kl_coeff=0.3),
    "ppo raw advantages": ppo_objective(0.2, 0.5, 0.01, normalize_advantages=False),
    "a2c": a2c_objective(0.5, 0.01),
    "a2c normalized, no entropy": a2c_objective(0.25, 0.0, normalize_advantages=True),
}


def random_inputs(n: int = 64, seed: int = 0) -> tuple[PolicyOutputs, Targets]:
    """Outputs and targets in ranges that visit both sides of every clip."""
    g = torch.Generator().manual_seed(seed)
    r = lambda scale=1.0: torch.randn(n, generator=g) * scale  # noqa: E731
    old_log_prob = -1.0 + 0.3 * r()
    out = PolicyOutputs(old_log_prob + 0.3 * r(), 0.5 + r(0.2).abs(), r())
    old_values = out.values + 0.4 * r()
    return out, Targets(old_log_prob, old_values, r(), r())


def autograd_of(term, x: torch.Tensor, targets: Targets) -> torch.Tensor:
    x = x.detach().clone().requires_grad_()
    (grad,) = torch.autograd.grad(term.loss(x, targets)[0], x)
    return grad


def as_arrays(t: tuple) -> tuple:
    return type(t)(*(None if x is None else x.numpy() for x in t))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", list(TERMS))
def test_every_terms_gradient_equals_autograd_on_tensors_and_arrays(name, seed):
    term = TERMS[name]
    out, targets = random_inputs(seed=seed)
    x = getattr(out, term.reads)
    expected = autograd_of(term, x, targets)
    torch.testing.assert_close(term.grad(x, targets), expected, rtol=1e-5, atol=1e-7)
    got = term.grad(x.numpy(), as_arrays(targets))
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    torch.testing.assert_close(torch.from_numpy(got), expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", list(TERMS))
def test_every_terms_loss_is_the_same_number_on_arrays(name):
    term = TERMS[name]
    out, targets = random_inputs(seed=4)
    x = getattr(out, term.reads)
    loss, stats = term.loss(x, targets)
    array_loss, array_stats = term.loss(x.numpy(), as_arrays(targets))
    assert np.asarray(array_loss).dtype == np.float32
    assert float(array_loss) == pytest.approx(loss.item(), rel=1e-5, abs=1e-7)
    assert set(array_stats) == set(stats)
    for key, value in stats.items():
        assert float(array_stats[key]) == pytest.approx(value.item(), rel=1e-5, abs=1e-7)


def test_clip_gradients_at_ties_split_as_autograd_does():
    """A ratio exactly at the clip edge and a clipped value exactly at its error: min and max
    of equal arguments share the gradient."""
    targets = Targets(
        old_log_prob=torch.zeros(2),
        old_values=torch.tensor([0.0, 1.0]),
        advantages=torch.tensor([1.0, -1.0]),
        returns=torch.tensor([0.5, 1.5]),
    )
    log_prob = torch.log(torch.tensor([1.2, 0.8]))
    for term, x in ((ClippedSurrogate(0.2), log_prob), (ValueRegression(0.5), targets.returns)):
        torch.testing.assert_close(term.grad(x, targets), autograd_of(term, x, targets))


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_objective_losses_and_gradients_agree_between_tensors_and_arrays(name):
    objective = OBJECTIVES[name]
    out, targets = random_inputs(n=48, seed=7)
    batch = _batch(targets)
    losses, stats = objective.losses(out, objective.targets(batch))
    array_losses, array_stats = objective.losses(
        as_arrays(out), objective.targets(as_arrays(batch))
    )
    assert list(losses)[-1] == "total" and list(array_losses) == list(losses)
    for key in losses:
        assert float(array_losses[key]) == pytest.approx(losses[key].item(), rel=1e-5, abs=1e-6)
    for key in stats:
        assert float(array_stats[key]) == pytest.approx(stats[key].item(), rel=1e-5, abs=1e-6)
    # The gradient of the weighted total, term by term, against autograd of the total.
    leaves = PolicyOutputs(*(x.detach().clone().requires_grad_() for x in out))
    total = objective.losses(leaves, objective.targets(batch))[0]["total"]
    expected = torch.autograd.grad(total, list(leaves), allow_unused=True)
    grads = objective.gradients(out, objective.targets(batch))
    array_grads = objective.gradients(as_arrays(out), objective.targets(as_arrays(batch)))
    for field, want, got, got_array in zip(
        PolicyOutputs._fields, expected, grads, array_grads, strict=True
    ):
        if want is None:
            assert got is None and got_array is None, field
            continue
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7, msg=field)
        torch.testing.assert_close(torch.from_numpy(got_array), want, rtol=1e-5, atol=1e-7)


def test_zero_weight_terms_are_reported_but_not_trained():
    objective = a2c_objective(vf_coef=0.5, ent_coef=0.0)
    out, targets = random_inputs(seed=1)
    losses, _ = objective.losses(out, objective.targets(_batch(targets)))
    assert "entropy" in losses
    expected_total = losses["policy"] + 0.5 * losses["value"]
    torch.testing.assert_close(losses["total"], expected_total)
    assert objective.gradients(out, objective.targets(_batch(targets))).entropy is None


def test_losses_by_hand():
    """PPO on two samples: ratios 1 and e^0.5 (past 1.2 with A > 0: clipped)."""
    out = PolicyOutputs(
        torch.tensor([0.0, 0.5]), torch.tensor([1.0, 3.0]), torch.tensor([1.0, 2.0])
    )
    targets = Targets(torch.zeros(2), torch.zeros(2), torch.tensor([2.0, 1.0]), torch.zeros(2))
    objective = Objective(
        [(1.0, ClippedSurrogate(0.2)), (0.5, ValueRegression()), (0.1, EntropyBonus())]
    )
    losses, stats = objective.losses(out, targets)
    policy = -(1.0 * 2.0 + 1.2 * 1.0) / 2
    value = 0.5 * (1.0 + 4.0) / 2
    entropy = -(1.0 + 3.0) / 2
    assert losses["policy"].item() == pytest.approx(policy)
    assert losses["value"].item() == pytest.approx(value)
    assert losses["entropy"].item() == pytest.approx(entropy)
    assert losses["total"].item() == pytest.approx(policy + 0.5 * value + 0.1 * entropy)
    assert stats["clip_fraction"].item() == pytest.approx(0.5)


def test_standardize_matches_torch_and_leaves_single_samples():
    x = torch.tensor([1.0, 2.0, 4.0, 7.0])
    expected = (x - x.mean()) / (x.std() + 1e-8)
    torch.testing.assert_close(standardize(x), expected)
    torch.testing.assert_close(torch.from_numpy(standardize(x.numpy())), expected)
    torch.testing.assert_close(standardize(torch.tensor([3.0])), torch.tensor([3.0]))


def test_objectives_refuse_duplicate_names_and_all_zero_weights():
    with pytest.raises(ValueError, match="distinct names"):
        Objective([(1.0, PolicyGradient()), (1.0, ClippedSurrogate(0.2))])
    with pytest.raises(ValueError, match="non-zero weight"):
        Objective([(0.0, PolicyGradient())])


def _batch(targets: Targets) -> RolloutBatch:
    """A `RolloutBatch` holding the targets (the fields `Objective.targets` reads)."""
    zeros = torch.zeros(len(targets.returns))
    if isinstance(targets.returns, np.ndarray):
        zeros = zeros.numpy()
    return RolloutBatch(zeros, zeros, *targets)
