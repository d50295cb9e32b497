"""QMIX's, VDN's and IQL's learner group update (`shoal.algos.multi_agent.qmix_group`): two
gloo processes, each updating on its episodes of the batch with the gradients all-reduced,
take the update one learner takes on the whole batch. No Ray: the ranks are forked."""

import numpy as np
import pytest
import torch
from gloo_ranks import on_two_ranks

from shoal.algos.cores.group_shares import share
from shoal.algos.multi_agent.qmix import QMIXConfig, QMIXLearner
from shoal.algos.multi_agent.qmix_group import EpisodeShare, episodes_of
from shoal.config import OptimConfig
from shoal.data.episode_replay import EpisodeBatch

T, B, N, A, IN, S = 5, 7, 3, 4, 6, 5  # steps, episodes (3 and 4 per rank), agents, actions
UPDATES = 3


def fixed_batch():
    """Episodes of different lengths (padding in the first rank's episodes, so its share of
    the real transitions is not its share of the episodes), agents that sit some steps out,
    terminations, illegal actions."""
    g = torch.Generator().manual_seed(4)
    filled = torch.ones(T, B, dtype=torch.bool)
    filled[3:, 0] = filled[2:, 1] = filled[4:, 5] = False
    active = torch.rand(T, B, N, generator=g) > 0.2
    mask = torch.rand(T + 1, B, N, A, generator=g) > 0.3
    mask[..., 0] = True
    terminated = torch.zeros(T, B, dtype=torch.bool)
    terminated[2, 0] = terminated[1, 1] = terminated[4, 3] = True
    return EpisodeBatch(
        obs=torch.randn(T + 1, B, N, IN, generator=g),
        state=torch.randn(T + 1, B, S, generator=g),
        actions=torch.randint(0, A, (T, B, N), generator=g),
        rewards=torch.randn(T, B, N, generator=g),
        terminated=terminated,
        filled=filled,
        active=active,
        action_mask=mask,
        indices=np.arange(B),
    )


def inputs():
    return torch.randn(T + 1, B, N, IN, generator=torch.Generator().manual_seed(8))


def make_learner(mixer):
    config = QMIXConfig(
        mixer=mixer, rnn_hidden=8, mixing_embed_dim=4, hypernet_embed=8, target_update_every=2,
        optim=OptimConfig(lr=0.01, max_grad_norm=0.5),
    )  # fmt: skip
    torch.manual_seed(0)
    return QMIXLearner(config, IN, A, N, S)


def _rank(rank, mixer):
    learner = make_learner(mixer)
    split = EpisodeShare(learner, rank, 2)
    rows = [split.update(((fixed_batch(), inputs()), [])) for _ in range(UPDATES)]
    return {"state": learner.state_dict(), "rows": rows}


@pytest.mark.parametrize("mixer", ["qmix", "vdn", "none"])
def test_two_learners_take_the_update_of_one(mixer, tmp_path):
    """Both ranks end with one learner's online and target networks and optimizer state after
    three updates (a hard target update after the second); each rank's weight is its share of
    the loss's transitions, and the weighted metrics are the single learner's."""
    ranks = on_two_ranks(_rank, tmp_path, mixer)
    single = make_learner(mixer)
    rows = [single.update(fixed_batch(), inputs()) for _ in range(UPDATES)]
    for part in ("online", "target"):
        for key, tensor in single.state_dict()[part].items():
            got = [rank["state"][part][key] for rank in ranks]
            assert torch.equal(got[0], got[1]), (part, key)
            torch.testing.assert_close(got[0], tensor, rtol=1e-5, atol=1e-6)
    moved = single.state_dict()["online"]
    initial = make_learner(mixer).state_dict()["online"]
    assert any(not torch.equal(moved[k], initial[k]) for k in moved)
    mask = single.loss_mask(fixed_batch())
    expected = [float(mask[:, share(B, r, 2)].sum()) / float(mask.sum()) for r in range(2)]
    assert expected[0] != pytest.approx(3 / 7)  # the padding makes the shares unequal
    for step in range(UPDATES):
        (w0, first, _), (w1, second, _) = (rank["rows"][step] for rank in ranks)
        assert [w0, w1] == pytest.approx(expected)
        for key, value in rows[step].items():
            assert float(w0 * first[key] + w1 * second[key]) == pytest.approx(
                float(value), rel=1e-4, abs=1e-6
            ), key


def test_an_episode_batch_is_cut_into_episodes_field_by_field():
    batch = fixed_batch()
    part = episodes_of(batch, share(B, 1, 2))
    assert part.obs.shape == (T + 1, 4, N, IN) and part.actions.shape == (T, 4, N)
    assert torch.equal(part.filled, batch.filled[:, 3:])
    assert part.indices.tolist() == [3, 4, 5, 6]
    assert episodes_of(batch._replace(action_mask=None), slice(0, 3)).action_mask is None
