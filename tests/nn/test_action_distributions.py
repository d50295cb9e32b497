"""The factorized and product action distributions (`shoal.nn.distributions`) against
hand-computed values, and the packed Tuple/Dict actions (`shoal.envs.composite`)."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from shoal.core.errors import UnsupportedSpaceError
from shoal.envs.composite import PackedActions
from shoal.nn.distributions import (
    Bernoulli,
    Categorical,
    DiagGaussian,
    MultiCategorical,
    Product,
)

LN = math.log


def test_multi_categorical_by_hand():
    # nvec [2, 3]: probabilities [1/4, 3/4] and [1/4, 1/4, 1/2].
    logits = torch.tensor([[0.0, LN(3), 0.0, 0.0, LN(2)]])
    dist = MultiCategorical(logits, [2, 3])
    want = LN(3 / 4) + LN(1 / 2)
    assert dist.log_prob(torch.tensor([[1, 2]])).item() == pytest.approx(want, abs=1e-6)
    h1 = -(0.25 * LN(0.25) + 0.75 * LN(0.75))
    h2 = -(2 * 0.25 * LN(0.25) + 0.5 * LN(0.5))
    assert dist.entropy().item() == pytest.approx(h1 + h2, abs=1e-6)
    assert dist.mode().tolist() == [[1, 2]]
    samples = MultiCategorical(logits.expand(20000, 5), [2, 3]).sample()
    assert samples[:, 0].float().mean().item() == pytest.approx(0.75, abs=0.02)
    assert (samples[:, 1] == 2).float().mean().item() == pytest.approx(0.5, abs=0.02)
    assert samples[:, 1].max().item() == 2  # never the padding of the shorter sub-action


def test_multi_categorical_kl_matches_torch():
    a, b = torch.randn(4, 7), torch.randn(4, 7)
    nvec = [3, 4]
    got = MultiCategorical(a, nvec).kl(MultiCategorical(b, nvec))
    want = sum(
        torch.distributions.kl_divergence(
            torch.distributions.Categorical(logits=x), torch.distributions.Categorical(logits=y)
        )
        for x, y in zip(a.split(nvec, -1), b.split(nvec, -1), strict=True)
    )
    torch.testing.assert_close(got, want)


def test_masked_multi_discrete_never_samples_an_illegal_sub_action():
    nvec = [3, 4]
    mask = torch.tensor([[True, False, True, False, False, True, False]])  # {0, 2} and {2}
    logits = torch.randn(1, 7).expand(5000, 7)
    dist = MultiCategorical(logits, nvec, mask.expand(5000, 7))
    samples = dist.sample()
    assert set(samples[:, 0].tolist()) == {0, 2}
    assert set(samples[:, 1].tolist()) == {2}
    assert dist.mode()[0, 0].item() in (0, 2) and dist.mode()[0, 1].item() == 2
    assert torch.isfinite(dist.entropy()).all()
    # The only legal second value has probability 1: its entropy is 0.
    single = MultiCategorical(torch.zeros(1, 7), nvec, mask)
    assert single.entropy().item() == pytest.approx(-(2 * 0.5 * LN(0.5)), abs=1e-6)
    assert single.log_prob(torch.tensor([[1, 2]])).item() < -1e8  # an illegal action


def test_bernoulli_by_hand():
    dist = Bernoulli(torch.tensor([[0.0, LN(3)]]))  # P(1) = 1/2, 3/4
    assert dist.log_prob(torch.tensor([[1, 0]])).item() == pytest.approx(LN(0.5) + LN(0.25))
    h = LN(2) - (0.75 * LN(0.75) + 0.25 * LN(0.25))
    assert dist.entropy().item() == pytest.approx(h, abs=1e-6)
    assert dist.mode().tolist() == [[0, 1]]
    samples = Bernoulli(torch.tensor([[0.0, LN(3)]]).expand(20000, 2)).sample()
    assert samples.float().mean(0).tolist() == pytest.approx([0.5, 0.75], abs=0.02)
    other = torch.tensor([[1.0, -1.0]])
    want = torch.distributions.kl_divergence(
        torch.distributions.Bernoulli(logits=torch.tensor([[0.0, LN(3)]])),
        torch.distributions.Bernoulli(logits=other),
    ).sum(-1)
    torch.testing.assert_close(dist.kl(Bernoulli(other)), want)


def test_product_adds_its_parts():
    cat = Categorical(torch.tensor([[0.0, LN(3)]]))  # [1/4, 3/4]
    gauss = DiagGaussian(torch.tensor([[0.5]]), torch.tensor([0.0]))
    bits = Bernoulli(torch.tensor([[0.0, 0.0]]))
    dist = Product([(cat, 0, 1), (gauss, 1, 2), (bits, 2, 4)])
    actions = torch.tensor([[1.0, 0.5, 1.0, 0.0]])
    want = LN(0.75) + (-0.5 * math.log(2 * math.pi)) + 2 * LN(0.5)
    assert dist.log_prob(actions).item() == pytest.approx(want, abs=1e-6)
    want_h = -(0.25 * LN(0.25) + 0.75 * LN(0.75)) + 0.5 * (1 + math.log(2 * math.pi)) + 2 * LN(2)
    assert dist.entropy().item() == pytest.approx(want_h, abs=1e-6)
    mode = dist.mode()
    assert mode.shape == (1, 4) and mode[0, 0].item() == 1.0 and mode[0, 1].item() == 0.5
    assert dist.sample().shape == (1, 4)
    assert dist.kl(dist).item() == pytest.approx(0.0, abs=1e-7)


def test_packed_actions_round_trip():
    space = PackedActions(
        gym.spaces.Dict(
            {
                "pick": gym.spaces.Discrete(3, start=1),
                "move": gym.spaces.Box(-1.0, 1.0, (2,)),
                "more": gym.spaces.Tuple(
                    (gym.spaces.MultiDiscrete([2, 5]), gym.spaces.MultiBinary(3))
                ),
            }
        )
    )
    assert space.width == 2 + 2 + 3 + 1
    assert [p.name for p in space.parts] == ["more.0", "more.1", "move", "pick"]
    rows = np.array([[1, 4, 1, 0, 1, 0.5, 3.0, 2]], np.float32)
    actions = space.unpack(rows)
    assert actions["pick"].tolist() == [3]  # index 2 from start 1
    assert actions["move"].tolist() == [[0.5, 1.0]]  # clipped to the bounds
    assert actions["more"][0].tolist() == [[1, 4]] and actions["more"][1].dtype == np.int8
    again = space.pack(actions)
    np.testing.assert_array_equal(again, [[1, 4, 1, 0, 1, 0.5, 1.0, 2]])
    assert space.sample().shape == (8,)


def test_unsupported_action_part_names_its_path():
    with pytest.raises(UnsupportedSpaceError, match="'grid' is Box.*1-D Box"):
        PackedActions(gym.spaces.Dict({"grid": gym.spaces.Box(0, 1, (2, 2))}))


def test_masked_categorical_head_entropy_covers_legal_actions_only():
    from shoal.nn.heads import CategoricalHead

    head = CategoricalHead(3, 4)
    features = torch.randn(5, 3)
    mask = torch.tensor([[True, False, True, True]] * 5)
    dist = head(features, mask)
    legal = head.logits(features)[:, [0, 2, 3]]
    want = torch.distributions.Categorical(logits=legal).entropy()
    torch.testing.assert_close(dist.entropy(), want)
    samples = head(features.repeat(400, 1), mask.repeat(400, 1)).sample()
    assert not (samples == 1).any()
