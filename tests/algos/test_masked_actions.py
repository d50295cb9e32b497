"""Legal-action masks in the on-policy family: Discrete and MultiDiscrete (per sub-action)
policies never act illegally, learn among the legal actions, and are evaluated and deployed
with the masks."""

import gymnasium as gym
import numpy as np
import pytest

import shoal
from shoal.core.errors import ConfigError, UnsupportedSpaceError

QUIET = {"run.console": False, "run.tensorboard": False, "run.checkpoint_every_steps": 0}


class MaskedEnv(gym.Env):
    """Each step draws legal values (at least one per sub-action) and shows them as the
    observation; the best action takes the largest legal value of each sub-action (reward 1
    per sub-action). An illegal action raises. Episodes are 4 steps."""

    def __init__(self, nvec=(4,)):
        self.nvec = list(nvec)
        self.multi = len(self.nvec) > 1
        width = sum(self.nvec)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (width,), np.float32)
        self.action_space = (
            gym.spaces.MultiDiscrete(self.nvec) if self.multi else gym.spaces.Discrete(self.nvec[0])
        )

    def _draw(self):
        parts = []
        for n in self.nvec:
            legal = self.np_random.random(n) < 0.5
            legal[self.np_random.integers(n)] = True
            parts.append(legal)
        self.parts = parts
        self.mask = np.concatenate(parts)
        return self.mask.astype(np.float32), {"action_mask": self.mask.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._draw()

    def step(self, action):
        actions = np.atleast_1d(np.asarray(action))
        reward = 0.0
        for legal, a in zip(self.parts, actions, strict=True):
            if not legal[int(a)]:
                raise AssertionError(f"illegal action {actions} for mask {self.mask}")
            reward += float(int(a) == int(np.flatnonzero(legal).max()))
        self.t += 1
        obs, info = self._draw()
        return obs, reward, False, self.t >= 4, info


class MaskedMultiEnv(MaskedEnv):
    def __init__(self):
        super().__init__((3, 4))


@pytest.mark.parametrize("nvec", [(4,), (3, 4)], ids=["discrete", "multidiscrete"])
@pytest.mark.parametrize("algo", ["ppo", "a2c", "trpo"])
def test_masked_policies_act_legally_and_learn(algo, nvec, tmp_path, registered_env):
    cls = MaskedEnv if len(nvec) == 1 else MaskedMultiEnv
    env_id = registered_env(f"test/Masked{len(nvec)}-v0", cls)
    result = shoal.train(
        algo,
        env=env_id,
        seed=0,
        total_steps=16_000,
        run_dir=str(tmp_path / "run"),
        **{
            "env.action_mask": "info",
            "env.num_envs": 8,
            "run.eval_every_steps": 16_000,
            "run.eval_episodes": 8,
            **QUIET,
        },
    )  # the env raises on any illegal action, in training and in evaluation
    best = 4.0 * len(nvec)
    assert result.eval_return >= 0.9 * best
    policy = shoal.load(result.run_dir)
    env = MaskedEnv(nvec)
    obs, info = env.reset(seed=3)
    for _ in range(50):
        action = policy.act(obs, action_mask=info["action_mask"], deterministic=False)
        obs, _, _, _, info = env.step(action)  # raises if illegal


def test_masks_need_a_discrete_policy(tmp_path, registered_env):
    class BoxMasked(MaskedEnv):
        def __init__(self):
            super().__init__()
            self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    env_id = registered_env("test/BoxMasked-v0", BoxMasked)
    with pytest.raises(UnsupportedSpaceError, match="masks apply to Discrete and MultiDiscrete"):
        shoal.train(
            "ppo", env=env_id, run_dir=str(tmp_path / "run"), **{"env.action_mask": "info", **QUIET}
        )
    with pytest.raises(ConfigError, match="trains through autograd"):
        shoal.build_config("ppo", **{"env.action_mask": "info", "model.backend": "numpy"})


def test_trpo_line_search_keeps_the_old_policy_of_a_product_distribution():
    """The old policy of TRPO's line search owns its tensors, down to the parts of a Tuple
    action's product distribution (a Gaussian part's log_std is a parameter view)."""
    import torch

    from shoal.algos.policy_gradient.trpo import _frozen
    from shoal.config import ModelConfig
    from shoal.envs.composite import PackedActions
    from shoal.nn.actor_critic import ActorCritic

    actions = PackedActions(gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(-1, 1, (1,)))))
    model = ActorCritic(gym.spaces.Box(-1, 1, (3,)), actions, ModelConfig(hidden=(8,)))
    obs = torch.zeros(4, 3)
    with torch.no_grad():
        old = _frozen(model.distribution(obs))
        before = old.entropy().clone()
        for param in model.parameters():
            param.add_(1.0)  # what the line search does in place
    torch.testing.assert_close(old.entropy(), before)
