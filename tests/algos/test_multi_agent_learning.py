"""Fixed-seed learning tests of multi-agent PPO: MAPPO beats a random policy on the built-in
cooperative navigation (shoal/spread-v0), trains both sides of mpe2's simple_adversary at
once, and crosses the built-in traffic intersection more often than the scripted drivers,
within CI-sized budgets."""

import pytest
from random_policy import RandomPolicy

import shoal
from shoal.collect.evaluate import evaluate, evaluate_joint
from shoal.config import EnvConfig, replace
from shoal.envs.heuristics import IntersectionHeuristic, TimeToConflictDriver
from shoal.envs.make import make_multi_agent_env

pytestmark = pytest.mark.learning

MARGIN = 5.0
"""Required gain in mean per-agent episode return over uniformly random actions, on the first
episode of 64 evaluation envs (measured: random -25.2, MAPPO -18.7 after 102k env steps)."""


def train_tuned(name, tmp_path, total_steps=102_400):
    """The tuned example ``name`` with seed 0 for ``total_steps``, quietly, no evaluations."""
    return shoal.train(
        tuned=name, seed=0, run_dir=str(tmp_path / "run"), total_steps=total_steps,
        **{"run.eval_every_steps": 0, "run.checkpoint_every_steps": 0, "run.console": False,
           "run.tensorboard": False},
    )  # fmt: skip


def test_mappo_beats_random_on_spread(tmp_path):
    env_config = EnvConfig(id="shoal/spread-v0", num_envs=64, agent_id=True, global_state=True)
    env = shoal.make_env(env_config)
    random_return = evaluate(RandomPolicy(5, seed=1), env, seed=2024)["eval/return"]

    result = train_tuned("mappo-spread", tmp_path)
    trained = evaluate(shoal.load(result.run_dir), env, seed=2024)["eval/return"]
    env.close()
    print(f"random {random_return:.2f}, MAPPO after 102k env steps {trained:.2f}")
    assert trained >= random_return + MARGIN, (trained, random_return)


TEAM_MARGIN = 4.0
"""Required gain of the trained agents over random agents, both against the trained adversary,
in the agents' mean episode return on simple_adversary (64 episodes; measured with seed 0:
trained 5.8, random agents -3.3 after 32k env steps)."""


@pytest.mark.extra("pettingzoo")
def test_two_policies_learn_simple_adversary_at_once(tmp_path):
    """MAPPO trains the adversary and the agents together (one policy per group); the agents
    it trains beat random agents against the adversary it trains."""
    result = shoal.train(
        "mappo",
        seed=0,
        run_dir=str(tmp_path / "run"),
        total_steps=32_768,
        **{"env.id": "pettingzoo:mpe2.simple_adversary_v3", "env.num_envs": 16,
           "num_steps": 128, "num_epochs": 4, "minibatch_size": 1024,
           "model.hidden": (64, 64), "run.eval_every_steps": 0,
           "run.checkpoint_every_steps": 0, "run.console": False, "run.tensorboard": False},
    )  # fmt: skip
    policy = shoal.load(result.run_dir)
    env = make_multi_agent_env(EnvConfig(id="pettingzoo:mpe2.simple_adversary_v3", num_envs=64))
    trained = evaluate_joint(policy, env, seed=2024)["eval/return/agent"]
    random_agents = policy.with_fixed({"agent": "random"}, env.groups)
    baseline = evaluate_joint(random_agents, env, seed=2024)["eval/return/agent"]
    env.close()
    print(f"agents' return against the trained adversary: trained {trained:.2f}, "
          f"random {baseline:.2f}")  # fmt: skip
    assert trained >= baseline + TEAM_MARGIN, (trained, baseline)


class Scripted:
    """A scripted driver of `shoal.envs.heuristics` as a policy on rows of agents."""

    def __init__(self, driver, env):
        self.driver = driver(env.observation_space, env.action_space)

    def act(self, obs, deterministic=True):
        return self.driver.act(obs)


def intersection_rates(tmp_path, total_steps: int):
    """The scripted drivers', then the trained tuned example's deterministic and stochastic
    rates, over the same 256 first episodes of random routes at low traffic, all deciding
    every 0.5 s as the tuned example does."""
    plain = EnvConfig(
        id="shoal/intersection-v0", num_envs=256, kwargs={"traffic": "low", "decision_steps": 5}
    )
    rates = {}
    for driver in (TimeToConflictDriver, IntersectionHeuristic):
        env = shoal.make_env(plain)
        rates[driver.__name__] = evaluate(Scripted(driver, env), env, seed=2024)
        env.close()
    result = train_tuned("mappo-intersection", tmp_path, total_steps=total_steps)
    env = shoal.make_env(replace(plain, agent_id=True, global_state=True))  # as MAPPO trained
    policy = shoal.load(result.run_dir)
    rates["argmax"] = evaluate(policy, env, seed=2024)
    rates["sampled"] = evaluate(policy, env, seed=2024, deterministic=False)
    env.close()
    for name, metrics in rates.items():
        print(name, {k: round(v, 3) for k, v in metrics.items() if "rate" in k})
        total = metrics["eval/completion_rate"] + metrics["eval/collision_rate"]
        assert total + metrics["eval/off_road_rate"] <= 1.0 + 1e-9
    return {
        name: (m["eval/completion_rate"], m["eval/collision_rate"]) for name, m in rates.items()
    }


def test_mappo_crosses_the_intersection_better_than_the_cone_driver(tmp_path):
    """After 102k decisions (the start of the tuned run, its learning rate decaying over
    500k): the deterministic policy completes 0.92 and collides 0.02 where the
    keep-lane-and-yield cone completes 0.51 and collides 0.49 (measured); the stochastic one
    completes 0.91. The time-to-conflict driver (0.93 and 0.07) is beaten on both rates only
    at the tuned budget (the slow test below)."""
    rates = intersection_rates(tmp_path, 102_400)
    cone = rates["IntersectionHeuristic"]
    assert rates["argmax"][0] >= cone[0] + 0.3, rates
    assert rates["argmax"][1] <= cone[1] / 4, rates
    assert rates["sampled"][0] >= cone[0] + 0.3, rates


@pytest.mark.slow
def test_mappo_at_its_budget_beats_the_time_to_conflict_driver(tmp_path):
    """The tuned example's 500k decisions (about 2.5 minutes): completion >= 0.9 with
    collisions <= 0.05 (issue 41's target), and no worse than the time-to-conflict driver
    deciding as often on either rate."""
    rates = intersection_rates(tmp_path, 500_000)
    ttc = rates["TimeToConflictDriver"]
    assert rates["argmax"][0] >= max(0.9, ttc[0]), rates
    assert rates["argmax"][1] <= min(0.05, ttc[1]), rates
