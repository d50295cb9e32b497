"""The LSTM core: chunked vs whole-sequence forward passes, resets at episode starts, and the
runner carrying the state across steps and rollouts."""

import gymnasium as gym
import numpy as np
import torch

from shoal.collect import EnvRunner
from shoal.config import EnvConfig, ModelConfig
from shoal.data.rollout import episode_starts, to_chunks
from shoal.nn import RecurrentActorCritic, build_actor_critic
from shoal.nn.recurrent import chunk_start_states

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACTIONS = gym.spaces.Discrete(2)


def model(seed=0):
    torch.manual_seed(seed)
    return RecurrentActorCritic(OBS, ACTIONS, ModelConfig(hidden=(8,), lstm_hidden=5))


def step_by_step(net, obs, state, starts):
    """Naive reference: one LSTM step at a time, zeroing the state where an episode starts."""
    outputs = []
    for t in range(obs.shape[0]):
        state = state * (~starts[t]).float().view(-1, 1, 1)
        features, state = net(obs[t : t + 1], state)
        outputs.append(features[0])
    return torch.stack(outputs), state


def sequence(steps=12, batch=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    obs = torch.rand(steps, batch, 3, generator=g)
    starts = torch.rand(steps, batch, generator=g) < 0.2
    starts[0, 0] = True
    state = torch.randn(batch, 2, 5, generator=g)
    return obs, starts, state


@torch.no_grad()
def test_whole_sequence_matches_naive_steps_with_resets():
    net = model()
    obs, starts, state = sequence()
    features, final = net(obs, state, starts)
    want_features, want_final = step_by_step(net, obs, state, starts)
    assert torch.allclose(features, want_features, atol=1e-6)
    assert torch.allclose(final, want_final, atol=1e-6)


@torch.no_grad()
def test_chunks_fed_carried_states_equal_the_unchunked_pass():
    net = model()
    obs, starts, state = sequence(steps=12)
    whole, final = net(obs, state, starts)
    for chunk in (1, 3, 4, 6, 12):
        carried, parts = state, []
        for begin in range(0, 12, chunk):
            features, carried = net(
                obs[begin : begin + chunk], carried, starts[begin : begin + chunk]
            )
            parts.append(features)
        assert torch.allclose(torch.cat(parts), whole, atol=1e-6), chunk
        assert torch.allclose(carried, final, atol=1e-6), chunk
        # The same pieces as a learner batches them: [chunk, N] columns from chunk_start_states.
        starts_of = chunk_start_states(net, obs, state, starts, chunk).flatten(0, 1)
        batched, _ = net(to_chunks(obs, chunk), starts_of, to_chunks(starts, chunk))
        assert torch.allclose(batched, to_chunks(whole, chunk), atol=1e-6), chunk


def test_reset_cuts_the_gradient_and_the_memory():
    """After a start the features do not depend on anything before it."""
    net = model()
    obs, _, state = sequence(steps=6, batch=1)
    obs.requires_grad_(True)
    starts = torch.zeros(6, 1, dtype=torch.bool)
    starts[3] = True
    features, _ = net(obs, state.requires_grad_(True), starts)
    features[3:].sum().backward()
    assert obs.grad[:3].abs().sum() == 0 and obs.grad[3:].abs().sum() > 0
    assert state.grad.abs().sum() == 0


def test_episode_starts_and_to_chunks():
    valid = torch.tensor([[True, True], [False, True], [True, False], [True, True]])
    starts = episode_starts(valid)
    assert starts.tolist() == [[False, False], [False, False], [True, False], [False, True]]
    x = torch.arange(8).reshape(4, 2)  # x[t, b] = 2t + b
    # Pieces of 2 steps: columns (piece 0, env 0), (0, 1), (1, 0), (1, 1).
    assert to_chunks(x, 2).tolist() == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_build_actor_critic_picks_the_core():
    assert isinstance(
        build_actor_critic(OBS, ACTIONS, ModelConfig(lstm_hidden=4)), RecurrentActorCritic
    )
    assert not isinstance(build_actor_critic(OBS, ACTIONS, ModelConfig()), RecurrentActorCritic)


def memory_runner(num_steps=20, length=3, seed=0):
    torch.manual_seed(seed)
    config = ModelConfig(hidden=(8,), lstm_hidden=6)
    env = EnvConfig(id="shoal/RepeatFirst-v0", num_envs=3, kwargs={"num_cues": 2, "length": length})
    return EnvRunner(env, lambda o, a: RecurrentActorCritic(o, a, config), num_steps, seed=seed)


def test_runner_resets_state_at_episode_starts_and_carries_it_across_rollouts():
    runner = memory_runner()
    seen = []
    step = runner.model.step

    def recording_step(obs, state, deterministic=False):
        seen.append(state.clone())
        return step(obs, state, deterministic)

    runner.model.step = recording_step
    first, _ = runner.sample()
    assert torch.equal(first.policy_state, torch.zeros(3, 2, 6))
    starts = episode_starts(first.valid)
    assert starts.any() and (~first.valid).any()
    states = torch.stack(seen)  # [T, B, 2, H]: the state each step acted from
    assert (states[starts] == 0).all()
    assert (states[1:][~starts[1:]].abs().sum((-1, -2)) > 0).all()  # carried elsewhere
    # Replaying the rollout from its stored initial state reproduces the sampler's values
    # and its final state, which the next rollout starts from.
    with torch.no_grad():
        features, final = runner.model(first.obs, first.policy_state, starts)
        _, values = runner.model.heads(features.flatten(0, 1))
    assert torch.allclose(values.view(20, 3), first.values, atol=1e-6)
    carried = runner.policy_state.clone()
    # An autoreset at the last step zeroes the carried state for the next rollout's first step.
    pending = first.valid[-1].float().view(-1, 1, 1)
    assert torch.allclose(final * pending, carried, atol=1e-6)
    second, _ = runner.sample()
    assert torch.equal(second.policy_state, carried)
    runner.close()


def test_runner_state_round_trips_through_get_state():
    a, b = memory_runner(), memory_runner(seed=5)
    a.sample()
    b.set_weights(a.model.state_dict())
    assert b.set_state(a.get_state(), fallback_seed=1)
    assert torch.equal(a.policy_state, b.policy_state)
    ra, _ = a.sample()
    rb, _ = b.sample()
    assert torch.equal(ra.obs, rb.obs) and torch.equal(ra.policy_state, rb.policy_state)
    a.close()
    b.close()


def test_deployed_distribution_carries_state_until_reset():
    net = model()
    obs, _, _ = sequence(steps=3, batch=2)
    with torch.no_grad():
        features, _ = net(obs, net.initial_state(2))
        for t in range(3):
            want = net.policy_head(features[t]).mode()
            assert torch.equal(net.distribution(obs[t]).mode(), want)
        net.reset_state()
        assert torch.allclose(net.distribution(obs[0]).logits, net.policy_head(features[0]).logits)


def test_deployed_policy_restarts_the_rows_whose_episode_starts():
    """`ActorPolicy.act(..., episode_start=mask)`: the masked rows start from a zero state,
    the others carry theirs."""
    from shoal.nn.policy import ActorPolicy

    net = model()
    obs, _, _ = sequence(steps=2, batch=3)
    policy = ActorPolicy(net)
    policy.act(obs[0].numpy())
    start = np.array([False, True, False])
    policy.act(obs[1].numpy(), episode_start=start)
    with torch.no_grad():
        _, after_first = net(obs[:1], net.initial_state(3))
        state = torch.where(torch.as_tensor(start)[:, None, None], 0.0, after_first)
        _, want = net(obs[1:2], state)
    torch.testing.assert_close(net._deployed_state, want)
