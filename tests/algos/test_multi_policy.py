"""MAPPO and IPPO with several policies: the policy map, per-policy learners, optimizers and
metrics, frozen policies, deployment, exact resume, and the errors of bad maps."""

import numpy as np
import pytest
import torch
from duel_env import Duel
from duel_env import factory as duel_factory
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.algos.multi_agent.multi_policy import MultiPolicyPPO
from shoal.core.errors import ConfigError
from shoal.envs.multi_agent import register_multi_agent_env
from shoal.envs.policy_map import resolve_policies
from shoal.nn.policy import JointPolicy
from shoal.train.checkpoint import load_checkpoint

register_multi_agent_env("shoal-test/duel-v0", duel_factory)
ITERATION = 4 * 8  # 4 envs x 8 steps


def small(**extra):
    overrides = {
        "env.id": "shoal-test/duel-v0",
        "env.num_envs": 4,
        "num_steps": 8,
        "minibatch_size": 16,
        "num_epochs": 2,
        "model.hidden": (16,),
        "run.eval_every_steps": 0,
        "run.checkpoint_every_steps": 0,
        "run.console": False,
        "run.tensorboard": False,
    }
    overrides.update(extra)
    return overrides


def test_policy_maps():
    groups = Duel(1).groups
    default = resolve_policies(groups)
    assert {n: p.agents for n, p in default.items()} == {
        "red": ("red_0",), "blue": ("blue_0", "blue_1")
    }  # fmt: skip
    per_agent = resolve_policies(groups, per_agent=True)
    assert list(per_agent) == ["red_0", "blue_0", "blue_1"]
    mapped = resolve_policies(groups, {"red": "chaser", "blue": "runners", "blue_1": "solo"})
    assert {n: p.parts for n, p in mapped.items()} == {
        "chaser": (("red", (0,)),), "runners": (("blue", (0,)),), "solo": (("blue", (1,)),)
    }  # fmt: skip
    alone = resolve_policies(groups, opponents={"red": "random"})
    assert list(alone) == ["blue"]
    rows = {"red": np.array([[1]]), "blue": np.array([[2, 3]])}
    solo = mapped["solo"]
    np.testing.assert_array_equal(solo.gather(rows), [[3]])
    out = {"red": np.zeros((1, 1)), "blue": np.zeros((1, 2))}
    solo.scatter(np.array([[7]]), out)
    np.testing.assert_array_equal(out["blue"], [[0, 7]])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policy_map": {"green": "x"}}, r"names \['green'\], which are neither groups"),
        ({"policy_map": {"red": "x"}}, r"leaves agents \['blue_0', 'blue_1'\] without a policy"),
        ({"policy_map": {"red": "all", "blue": "all"}}, r"groups \['red', 'blue'\] whose"),
        ({"policy_map": {"red": "x"}, "opponents": {"red": "random"}}, "act by env.opponents"),
        ({"opponents": {"red": "random", "blue": "random"}}, "nothing is left to train"),
    ],
)
def test_bad_policy_maps_are_named(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        resolve_policies(Duel(1).groups, **kwargs)


def test_two_policies_train_with_their_own_settings():
    """Each policy's learner takes its own settings and its own steps: both sets of weights
    move, each optimizer with its own learning rate, each loss with its own entropy weight
    (blue's entropy term counts in its total, red's, at PPO's default 0, does not)."""
    policies = {"blue": {"optim": {"lr": 1e-3}, "ent_coef": 0.01}}
    algo = MultiPolicyPPO(shoal.build_config("mappo", policies=policies, **small()))
    try:
        before = {n: {k: v.clone() for k, v in lrn.model.state_dict().items()}
                  for n, lrn in algo.learners.items()}  # fmt: skip
        seen = [algo.train_iteration() for _ in range(3)]
        for name, learner in algo.learners.items():
            after = learner.model.state_dict()
            assert any(not torch.equal(after[k], before[name][k]) for k in after), name
        assert algo.learners["blue"].optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)
        assert algo.learners["red"].optimizer.param_groups[0]["lr"] == pytest.approx(3e-4)
    finally:
        algo.close()
    last = seen[-1]
    assert last["train/blue/lr"] == pytest.approx(1e-3)
    assert last["train/red/lr"] == pytest.approx(3e-4)  # PPO's default
    for name, ent_coef in (("red", 0.0), ("blue", 0.01)):
        terms = ("policy", "value", "entropy", "total")
        loss = {term: last[f"loss/{name}/{term}"] for term in terms}
        # PPO's objective: clipped surrogate + 0.5 x value loss + ent_coef x entropy loss.
        expected = loss["policy"] + 0.5 * loss["value"] + ent_coef * loss["entropy"]
        assert loss["total"] == pytest.approx(expected, rel=1e-4, abs=1e-6), name
    logged = {key for m in seen for key in m}
    assert {"episode/return/red", "episode/return/blue", "episode/return/blue_1"} <= logged


def test_a_frozen_policy_never_changes_and_the_other_learns():
    config = shoal.build_config("mappo", policies={"red": {"frozen": True}}, **small())
    algo = MultiPolicyPPO(config)
    try:
        before = {n: {k: v.clone() for k, v in lrn.model.state_dict().items()}
                  for n, lrn in algo.learners.items()}  # fmt: skip
        metrics = {}
        for _ in range(3):
            metrics.update(algo.train_iteration())
        assert not any(key.startswith("loss/red/") for key in metrics)
        assert_states_equal(algo.learners["red"].model.state_dict(), before["red"])
        assert algo.learners["red"].optimizer.state == {}  # never stepped
        blue = algo.learners["blue"].model.state_dict()
        assert any(not torch.equal(blue[k], before["blue"][k]) for k in blue)
        # The acting copies hold the learners' weights after each update.
        acting = algo.acting.models["blue"].state_dict()
        assert all(torch.equal(acting[k], blue[k]) for k in blue)
    finally:
        algo.close()


def test_rows_of_each_policy_are_batched_separately():
    config = shoal.build_config("mappo", **small(**{"env.policy_per_agent": True}))
    algo = MultiPolicyPPO(config)
    try:
        algo.runner.sample()
        rollouts = algo.acting.rollouts(algo.runner.view)
        assert set(rollouts) == {"red_0", "blue_0", "blue_1"}
        for rollout in rollouts.values():
            assert rollout.rewards.shape == (8, 4)  # one row per env: one agent per policy
        # MAPPO's rows: own observation, one-hot (of the policy's agents), then the state.
        assert rollouts["red_0"].obs.shape[-1] == 3 + 1 + 3 + 1
        assert rollouts["blue_1"].obs.shape[-1] == 2 + 1 + 3 + 1
    finally:
        algo.close()


def test_rollouts_hold_each_agents_own_steps():
    config = shoal.build_config("ippo", **small(**{"env.agent_id": False}))
    algo = MultiPolicyPPO(config)
    try:
        view = algo.runner.view
        rollout = algo.runner.sample()
        rows = algo.acting.rollouts(algo.runner.view)
        blue = rows["blue"]  # rows are (env, agent) pairs, agents in order
        np.testing.assert_array_equal(
            blue.obs[0].numpy(), view.obs["blue"].reshape(8, 2).astype(np.float32)
        )
        np.testing.assert_allclose(blue.rewards.numpy(), rollout.rewards["blue"].reshape(8, 8))
        np.testing.assert_array_equal(
            blue.actions.numpy().reshape(8, 4, 2), rollout.actions["blue"]
        )
        np.testing.assert_array_equal(
            rows["red"].actions.numpy().reshape(8, 4, 1), rollout.actions["red"][..., 0]
        )
    finally:
        algo.close()


def test_deploys_every_policy_together(tmp_path):
    result = shoal.train(
        "mappo",
        run_dir=str(tmp_path / "run"),
        total_steps=2 * ITERATION,
        **small(**{"run.eval_every_steps": ITERATION, "run.eval_episodes": 3}),
    )
    policy = shoal.load(result.run_dir)
    assert isinstance(policy, JointPolicy) and policy.groups == ["red", "blue"]
    env = Duel(3)
    obs, state = env.reset(seed=1)
    actions = policy.act(obs)
    assert actions["red"].shape == (3, 1, 1) and actions["blue"].shape == (3, 2)
    # The critic-only state does not change the policies' actions.
    np.testing.assert_array_equal(policy.act(obs, state=state)["blue"], actions["blue"])
    # The same actions as the trained policy of the run, acting on its rows.
    algo = MultiPolicyPPO(shoal.build_config("mappo", **small()))
    try:
        algo.load_state_dict(load_checkpoint(result.run_dir).state["algorithm"])
        rows = algo.policy_set.rows["blue"].rows(obs["blue"], state)
        model = algo.learners["blue"].model
        want = model.distribution(torch.as_tensor(rows)).mode().numpy().reshape(3, 2)
        np.testing.assert_array_equal(actions["blue"], want)
    finally:
        algo.close()


def test_two_policy_resume_is_exact(tmp_path):
    first, total = 3 * ITERATION, 6 * ITERATION
    overrides = small(**{"run.checkpoint_every_steps": ITERATION})
    policies = {"blue": {"optim": {"lr": 1e-3}}}
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    part = shoal.train(
        "mappo", seed=4, total_steps=first, run_dir=a, policies=policies, **overrides
    )
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    straight = shoal.train(
        "mappo", seed=4, total_steps=total, run_dir=b, policies=policies, **overrides
    )
    got = load_checkpoint(resumed.run_dir).state["algorithm"]
    want = load_checkpoint(straight.run_dir).state["algorithm"]
    assert_states_equal(got, want)
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"policies": {"green": {"ent_coef": 0.1}}}, r"policies names \['green'\]"),
        ({"policies": {"red": {"env": {"num_envs": 2}}}}, "settings are the run's, not a polic"),
        (
            {"policies": {"red": {"optim": {"lrr": 0.1}}}},
            "unknown config field 'policies.red.optim.lrr'",
        ),
        ({"env.normalize_obs": True}, "normalize_obs is not supported with several policies"),
    ],
)
def test_bad_policy_settings_fail_before_training(extra, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        shoal.train("mappo", run_dir=str(tmp_path / "x"), total_steps=ITERATION, **small(**extra))


def test_learners_of_one_group_refuse_policy_maps(tmp_path):
    with pytest.raises(ConfigError, match="policy_map"):
        shoal.build_config(
            "maddpg", **{"env.id": "shoal-test/duel-v0", "env.policy_per_agent": True}
        )
    a2c = {"env.id": "shoal-test/duel-v0", "env.policy_map": {"red": "a", "blue": "b"},
           "run.console": False, "run.tensorboard": False}  # fmt: skip
    with pytest.raises(ConfigError, match="choose the policies of mappo and ippo"):
        shoal.train("a2c", run_dir=str(tmp_path / "p"), total_steps=ITERATION, **a2c)
    # PPO is MAPPO and IPPO without their defaults: it takes the map.
    seen = []
    shoal.train("ppo", run_dir=str(tmp_path / "q"), total_steps=ITERATION,
                on_iteration=lambda step, metrics: seen.append(metrics),
                **small(**{"env.policy_map": {"red": "a", "blue": "b"}}))  # fmt: skip
    assert {"loss/a/policy", "loss/b/policy"} <= set(seen[-1])


@pytest.mark.extra("pettingzoo")
def test_each_player_of_a_board_game_trains_its_own_policy_with_masks(tmp_path):
    """Tic-tac-toe through the turn-based adapter, one policy per player: legal moves only
    (an illegal move would end the game with a penalty the players never get)."""
    seen = []
    shoal.train(
        "ippo",
        run_dir=str(tmp_path / "ttt"),
        total_steps=1024,
        on_iteration=lambda step, metrics: seen.append(metrics),
        **{"env.id": "pettingzoo:pettingzoo.classic.tictactoe_v3", "env.policy_per_agent": True,
           "env.num_envs": 8, "num_steps": 32, "minibatch_size": 64, "num_epochs": 2,
           "model.hidden": (16,), "run.eval_every_steps": 0, "run.console": False,
           "run.tensorboard": False},
    )  # fmt: skip
    assert {"loss/player_1/policy", "loss/player_2/policy"} <= set(seen[-1])
    ended = [m for m in seen if "episode/count" in m]
    assert ended and all(m["episode/length"] >= 5 for m in ended)  # no game ends before move 5
    for m in ended:  # zero-sum, win/draw/loss: returns in [-1, 1] and opposite
        assert m["episode/return/player_1"] == pytest.approx(-m["episode/return/player_2"])


def test_evaluation_leaves_training_alone(tmp_path):
    """Evaluating (with its own fixed opponents and seeds) changes nothing in training."""
    extra = {"env.policy_map": {"blue_0": "a", "blue_1": "b"}, "env.opponents": {"red": "random"}}
    rows = []
    for every in (0, ITERATION):
        run = shoal.train("mappo", seed=2, run_dir=str(tmp_path / f"e{every}"),
                          total_steps=3 * ITERATION,
                          **small(**extra, **{"run.eval_every_steps": every,
                                              "run.eval_episodes": 2}))  # fmt: skip
        train_keys = lambda row: {k: v for k, v in row.items()  # noqa: E731
                                  if not k.startswith(("eval/", "perf/", "time/"))}  # fmt: skip
        rows.append([train_keys(row) for row in metric_rows(run.run_dir)])
    assert rows[0] == rows[1]
    assert "loss/a/policy" in rows[0][-1] and "episode/return/red_0" not in rows[0][-1]
