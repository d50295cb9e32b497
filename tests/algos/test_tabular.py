"""Tabular TD control: hand-computed updates, the registry names, smoke runs, resume, CLI."""

import json

import gymnasium as gym
import numpy as np
import pytest
import torch
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.algos.value import tabular
from shoal.algos.value.tabular import (
    EpsilonGreedy,
    QTable,
    Tabular,
    TabularConfig,
    TabularStep,
    epsilon_greedy,
    epsilon_greedy_probs,
    sequential_weights,
    td_update,
)
from shoal.cli import main
from shoal.config import EnvConfig
from shoal.core.errors import ConfigError, UnsupportedSpaceError
from shoal.registry import algorithm_for_config, find_tuned, get_algorithm
from shoal.train.checkpoint import load_checkpoint

QUIET = {
    "run.eval_every_steps": 0,
    "run.checkpoint_every_steps": 0,
    "run.console": False,
    "run.tensorboard": False,
}
# 4 envs x 8 vector steps = 32 env steps per iteration.
SMALL = {"env.num_envs": 4, "steps_per_iteration": 8, **QUIET}
ITERATION_STEPS = 32
NAMES = ["q-learning", "sarsa", "expected-sarsa", "sarsa-lambda", "q-lambda"]
ENVS = ["FrozenLake-v1", "CliffWalking-v1", "Taxi-v4"]


def make_step(s_tm1, a_tm1, r_t, s_t, a_t=None, terminated=None, truncated=None, valid=None):
    s_tm1 = np.asarray(s_tm1)
    flags = lambda x, default: np.full(len(s_tm1), default) if x is None else np.asarray(x)
    return TabularStep(
        s_tm1,
        np.asarray(a_tm1),
        np.asarray(r_t, np.float64),
        np.asarray(s_t),
        np.zeros_like(s_tm1) if a_t is None else np.asarray(a_t),
        flags(terminated, False),
        flags(truncated, False),
        flags(valid, True),
    )


def config(method, **kwargs):
    return TabularConfig(method=method, **kwargs)


# --- one-step targets, hand-computed ------------------------------------------------------------

Q0 = np.array([[0.0, 0.0], [1.0, 3.0], [2.0, 2.0]])


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("q_learning", 1 + 0.5 * 3.0),  # max_a Q(1, a)
        ("sarsa", 1 + 0.5 * 1.0),  # Q(1, a_t=0)
        # epsilon 0.2 over 2 actions: greedy action 1 has 0.9, action 0 has 0.1.
        ("expected_sarsa", 1 + 0.5 * (0.1 * 1.0 + 0.9 * 3.0)),
    ],
)
def test_one_step_targets(method, target):
    q = Q0.copy()
    step = make_step([0], [0], [1.0], [1], a_t=[0])
    delta = td_update(q, None, step, config(method, alpha=0.5, gamma=0.5), epsilon=0.2)
    assert delta == pytest.approx([target])
    expected = Q0.copy()
    expected[0, 0] = 0.5 * target
    np.testing.assert_allclose(q, expected)


def test_expected_sarsa_splits_greedy_mass_between_ties():
    probs = epsilon_greedy_probs(np.array([[2.0, 2.0, 0.0], [1.0, 0.0, 0.0]]), 0.3)
    np.testing.assert_allclose(probs, [[0.45, 0.45, 0.1], [0.8, 0.1, 0.1]])
    q = Q0.copy()
    step = make_step([0], [1], [0.0], [2])
    td_update(q, None, step, config("expected_sarsa", alpha=1.0, gamma=1.0), epsilon=0.3)
    assert q[0, 1] == pytest.approx(2.0)  # ties: the expectation is their common value


@pytest.mark.parametrize("method", ["q_learning", "sarsa", "expected_sarsa"])
def test_terminated_does_not_bootstrap_truncated_does(method):
    q = Q0.copy()
    step = make_step([0, 0], [0, 1], [1.0, 1.0], [1, 1], terminated=[True, False])
    step = step._replace(truncated=np.array([False, True]))
    delta = td_update(q, None, step, config(method, alpha=1.0, gamma=0.5), epsilon=0.0)
    # Terminal: target = r. Truncated: bootstraps from the final observation (greedy 3.0 with
    # epsilon 0; sarsa's a_t = 0 gives 1.0).
    bootstrap = 1.0 if method == "sarsa" else 3.0
    np.testing.assert_allclose(delta, [1.0, 1.0 + 0.5 * bootstrap])
    np.testing.assert_allclose(q[0], delta)


@pytest.mark.parametrize("method", ["q_learning", "sarsa_lambda"])
def test_autoreset_steps_are_not_learned_from(method):
    q = Q0.copy()
    traces = np.zeros((2, 3, 2)) if method == "sarsa_lambda" else None
    step = make_step([1, 2], [1, 0], [5.0, 7.0], [0, 0], valid=[False, False])
    delta = td_update(q, traces, step, config(method, alpha=0.5), epsilon=0.1)
    np.testing.assert_array_equal(delta, [0.0, 0.0])
    np.testing.assert_array_equal(q, Q0)
    if traces is not None:
        assert not traces.any()


def test_duplicate_pairs_accumulate_as_sequential_updates():
    """Envs 0, 1 and 3 share (s=0, a=1): all three count, as if applied one after another."""
    alpha = 0.5
    q = np.zeros((3, 2))
    rewards = [1.0, 3.0, 4.0, -2.0]
    step = make_step([0, 0, 1, 0], [1, 1, 0, 1], rewards, [2, 2, 2, 2], terminated=[True] * 4)
    td_update(q, None, step, config("q_learning", alpha=alpha), epsilon=0.0)
    # One env at a time: Q <- Q + alpha * (r - Q) on the terminal targets.
    naive = np.zeros((3, 2))
    for s, a, r in zip(step.s_tm1, step.a_tm1, rewards, strict=True):
        naive[s, a] += alpha * (r - naive[s, a])
    np.testing.assert_allclose(q, naive)
    assert q[0, 1] == pytest.approx(0.125 * 1 + 0.25 * 3 + 0.5 * -2)
    assert q[1, 0] == pytest.approx(2.0)


def test_sequential_weights_reduce_to_alpha_for_one_env():
    z = np.array([[[0.0, 1.0], [0.5, 2.0]]])
    np.testing.assert_allclose(sequential_weights(0.3, z), 0.3 * z)
    z2 = np.stack([z[0], z[0]])
    np.testing.assert_allclose(sequential_weights(0.3, z2)[0], 0.3 * z[0] * (1 - 0.3 * z[0]))


# --- eligibility traces -------------------------------------------------------------------------


def run_trace_episode(trace, q=None):
    """One env: (0,0) -> 1, (1,0) -> 0, (0,1) -> 0, (0,1) -> 2 terminal with reward 1."""
    cfg = config("sarsa_lambda", trace=trace, alpha=0.5, gamma=1.0, trace_lambda=0.5)
    q = np.zeros((3, 2)) if q is None else q
    traces = np.zeros((1, 3, 2))
    history = []
    for s, a, r, s_next, a_next, done in [
        (0, 0, 0.0, 1, 0, False),
        (1, 0, 0.0, 0, 1, False),
        (0, 1, 0.0, 0, 1, False),
        (0, 1, 1.0, 2, 0, True),
    ]:
        step = make_step([s], [a], [r], [s_next], a_t=[a_next], terminated=[done])
        td_update(q, traces, step, cfg, epsilon=0.0)
        history.append(traces[0].copy())
    return q, history


def test_accumulating_and_replacing_traces_on_revisits():
    _, acc = run_trace_episode("accumulating")
    _, rep = run_trace_episode("replacing")
    # gamma * lambda = 0.5. After step 3 (state 0 revisited with action 1):
    np.testing.assert_allclose(acc[2], [[0.125, 0.5], [0.25, 0.0], [0.0, 0.0]])
    np.testing.assert_allclose(rep[2], [[0.0, 0.5], [0.25, 0.0], [0.0, 0.0]])
    # Traces are cleared at the end of the episode.
    assert not acc[3].any() and not rep[3].any()
    # The final reward reaches every entry by its trace before the decay (all other TD errors
    # are zero): accumulating (0,1) = 0.5 + 1 = 1.5, replacing 1; alpha = 0.5.
    q_acc, _ = run_trace_episode("accumulating")
    q_rep, _ = run_trace_episode("replacing")
    np.testing.assert_allclose(q_acc, 0.5 * np.array([[0.125, 1.5], [0.25, 0], [0, 0]]))
    np.testing.assert_allclose(q_rep, 0.5 * np.array([[0.0, 1.0], [0.25, 0], [0, 0]]))


def naive_lambda_episode(method, trace, q, transitions, alpha, gamma, lam):
    """S&B's one-env SARSA(lambda) / Watkins's Q(lambda) pseudocode, loop by loop."""
    z = np.zeros_like(q)
    for s, a, r, s2, a2, done in transitions:
        if method == "q_lambda":
            target = r + (0.0 if done else gamma * q[s2].max())
        else:
            target = r + (0.0 if done else gamma * q[s2, a2])
        greedy = q[s2, a2] == q[s2].max()
        delta = target - q[s, a]
        if trace == "replacing":
            z[s, :] = 0.0
            z[s, a] = 1.0
        else:
            z[s, a] += 1.0
        for i in range(q.shape[0]):
            for j in range(q.shape[1]):
                q[i, j] += alpha * delta * z[i, j]
                z[i, j] *= 0.0 if done or (method == "q_lambda" and not greedy) else gamma * lam
    return q


@pytest.mark.parametrize("method", ["sarsa_lambda", "q_lambda"])
@pytest.mark.parametrize("trace", ["accumulating", "replacing"])
def test_lambda_methods_match_the_textbook_loop(method, trace):
    rng = np.random.default_rng(0)
    q0 = rng.normal(size=(5, 3))
    transitions = []
    s = 0
    for t in range(40):
        a, s2, a2 = rng.integers(3), rng.integers(5), rng.integers(3)
        transitions.append((s, a, rng.normal(), s2, a2, t % 13 == 12))
        s = s2
    # Consistent chain: each step's a_t is the next step's a_tm1.
    transitions = [
        (s, transitions[i - 1][4] if i else a, r, s2, a2, done)
        for i, (s, a, r, s2, a2, done) in enumerate(transitions)
    ]
    cfg = config(method, trace=trace, alpha=0.1, gamma=0.9, trace_lambda=0.8)
    q, traces = q0.copy(), np.zeros((1, 5, 3))
    for s, a, r, s2, a2, done in transitions:
        td_update(q, traces, make_step([s], [a], [r], [s2], [a2], [done]), cfg, epsilon=0.1)
    want = naive_lambda_episode(method, trace, q0.copy(), transitions, 0.1, 0.9, 0.8)
    np.testing.assert_allclose(q, want)


def test_watkins_cuts_traces_after_exploratory_actions():
    cfg = config("q_lambda", alpha=0.5, gamma=1.0, trace_lambda=0.5)
    q = Q0.copy()  # in state 1 action 1 is greedy; in state 2 both actions tie
    traces = np.zeros((3, 3, 2))
    step = make_step([0, 0, 0], [0, 0, 0], [0.0] * 3, [1, 1, 2], a_t=[1, 0, 0])
    td_update(q, traces, step, cfg, epsilon=0.1)
    # Greedy next action (env 0) and a tie for the max (env 2): decayed by gamma * lambda.
    # Exploratory next action (env 1): cut to zero.
    assert traces[0, 0, 0] == 0.5 and traces[2, 0, 0] == 0.5
    assert not traces[1].any()
    # The target is the max either way: 0 + 3 for envs 0 and 1, 2 for env 2.
    cfg_sarsa = config("sarsa_lambda", alpha=0.5, gamma=1.0, trace_lambda=0.5)
    traces_sarsa = np.zeros((3, 3, 2))
    td_update(Q0.copy(), traces_sarsa, step, cfg_sarsa, epsilon=0.1)
    assert traces_sarsa[1, 0, 0] == 0.5  # SARSA(lambda) never cuts


# --- action selection and the policy model ------------------------------------------------------


def test_epsilon_greedy_breaks_ties_at_random_and_explores():
    rng = np.random.default_rng(0)
    q_s = np.tile([[1.0, 1.0, 0.0]], (20_000, 1))
    greedy = epsilon_greedy(q_s, 0.0, rng)
    assert set(np.unique(greedy)) == {0, 1}
    assert abs((greedy == 0).mean() - 0.5) < 0.02
    counts = np.bincount(epsilon_greedy(q_s, 0.3, rng), minlength=3) / len(q_s)
    np.testing.assert_allclose(counts, epsilon_greedy_probs(q_s[:1], 0.3)[0], atol=0.02)


def test_policy_model_mode_is_greedy_with_lowest_index_ties():
    model = QTable(3, 3)
    model.q.copy_(torch.tensor([[0.0, 1.0, 1.0], [5.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    dist = model.distribution(torch.tensor([0, 1, 2, 0]))
    assert dist.mode().tolist() == [1, 0, 0, 1]
    np.testing.assert_array_equal(model.greedy_actions(), [1, 0, 0])
    # sample(): epsilon-greedy with the stored epsilon, ties at random.
    torch.manual_seed(0)
    samples = EpsilonGreedy(model.q[torch.zeros(4000, dtype=torch.long)], 0.0).sample()
    assert set(samples.tolist()) == {1, 2}
    samples = EpsilonGreedy(model.q[torch.ones(4000, dtype=torch.long)], 1.0).sample()
    assert set(samples.tolist()) == {0, 1, 2}


# --- config and registry ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"alpha": 0.0}, "TabularConfig.alpha = 0.0 is invalid: must be in (0, 1]"),
        ({"trace_lambda": 1.5}, "TabularConfig.trace_lambda = 1.5 is invalid"),
        ({"method": "td0"}, "must be one of 'q_learning'"),
        ({"env": EnvConfig(id="FrozenLake-v1", normalize_obs=True)}, "EnvConfig.normalize_obs"),
    ],
)
def test_invalid_config_names_the_field(kwargs, message):
    with pytest.raises(ConfigError) as info:
        TabularConfig(**kwargs)
    assert message in str(info.value)


def test_each_name_selects_its_method_and_maps_back():
    for name, (method, _) in tabular.METHODS.items():
        built = shoal.build_config(name)
        assert isinstance(built, TabularConfig)
        assert built.method == (method or "q_learning")
        assert algorithm_for_config(built).name == (name if method else "q-learning")
    assert algorithm_for_config(TabularConfig(method="q_lambda")).name == "q-lambda"
    assert algorithm_for_config(shoal.build_config("ppo")).name == "ppo"
    assert get_algorithm("Q-Learning").default_config(alpha=0.3).alpha == 0.3


def test_tuned_examples_build_with_their_method():
    cliff = find_tuned("q-learning-cliffwalking").build_config()
    assert cliff.method == "q_learning" and cliff.env.id == "CliffWalking-v1"
    lake = find_tuned("sarsa-lambda-frozenlake").build_config()
    assert lake.method == "sarsa_lambda" and lake.env.kwargs == {"is_slippery": False}


def test_list_shows_the_tabular_names(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in [*NAMES, "q-learning-cliffwalking", "sarsa-lambda-frozenlake"]:
        assert name in out, name


# --- smoke --------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", ENVS)
@pytest.mark.parametrize("name", NAMES)
def test_smoke(name, env_id, tmp_path):
    seen = []
    result = shoal.train(
        name,
        env=env_id,
        total_steps=2 * ITERATION_STEPS,
        run_dir=str(tmp_path / "run"),
        on_iteration=lambda steps, metrics: seen.append(dict(metrics)),
        **{**SMALL, "env.max_episode_steps": 5},  # short episodes: some end in each iteration
    )
    assert result.env_steps == 2 * ITERATION_STEPS and result.iterations == 2
    for metrics in seen:
        for key in ("train/epsilon", "train/abs_td_error", "episode/return", "episode/length"):
            assert np.isfinite(metrics[key]), key
    state = load_checkpoint(result.run_dir)
    assert state.meta["algo"] == name
    assert (state.state["algorithm"]["traces"] is None) == (
        name not in ("sarsa-lambda", "q-lambda")
    )

    policy = shoal.load(result.run_dir)
    n_states = policy.model.q.shape[0]
    greedy = policy.model.greedy_actions()
    assert greedy.shape == (n_states,) and greedy.dtype == np.int64
    env = shoal.make_env(env_id, num_envs=3)
    obs = env.reset(seed=1)
    actions = policy.act(obs)
    np.testing.assert_array_equal(actions, greedy[obs])
    assert policy.act(obs, deterministic=False).shape == (3,)
    env.close()


def test_greedy_export_from_a_finished_run(tmp_path):
    result = shoal.train(
        "sarsa", env="Taxi-v4", total_steps=4 * ITERATION_STEPS, run_dir=str(tmp_path), **SMALL
    )
    q = load_checkpoint(result.run_dir).state["algorithm"]["policy"]["model"]["q"]
    exported = shoal.load(result.run_dir).model.greedy_actions()
    np.testing.assert_array_equal(exported, q.argmax(1).numpy())
    assert q.abs().sum() > 0  # it learned something to export
    algo = Tabular(shoal.build_config("sarsa", env="Taxi-v4", **SMALL))
    assert algo.greedy_actions().shape == (500,)
    algo.close()


def test_autoreset_transitions_are_marked_invalid(monkeypatch):
    steps = []
    real = tabular.td_update

    def spy(q, traces, step, cfg, epsilon):
        steps.append(step)
        return real(q, traces, step, cfg, epsilon)

    monkeypatch.setattr(tabular, "td_update", spy)
    env = EnvConfig(id="FrozenLake-v1", num_envs=2, max_episode_steps=1)
    algo = Tabular(TabularConfig(env=env, steps_per_iteration=8))
    algo.train_iteration()
    algo.close()
    # Every episode is one step long and truncated; the step after it is an autoreset.
    for i, step in enumerate(steps):
        assert step.valid.all() == (i % 2 == 0) and step.valid.any() == (i % 2 == 0)
        assert (step.truncated | step.terminated).all() == (i % 2 == 0)
    # Each transition starts where the previous step's observation left off.
    for prev, step in zip(steps, steps[1:], strict=False):
        np.testing.assert_array_equal(step.s_tm1, prev.s_t)
        np.testing.assert_array_equal(step.a_tm1, prev.a_t)


# --- errors -------------------------------------------------------------------------------------


class DiscreteObsBoxActionEnv(gym.Env):
    observation_space = gym.spaces.Discrete(3)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return 0, {}

    def step(self, action):
        return 0, 0.0, True, False, {}


def test_box_observations_are_unsupported(tmp_path):
    with pytest.raises(UnsupportedSpaceError, match=r"observation space Box\("):
        shoal.train("q-learning", env="CartPole-v1", run_dir=str(tmp_path), **SMALL)


def test_box_actions_are_unsupported(tmp_path):
    env_id = "shoal-test/DiscreteObsBoxAction-v0"
    gym.register(env_id, entry_point=DiscreteObsBoxActionEnv, max_episode_steps=5)
    try:
        with pytest.raises(UnsupportedSpaceError, match=r"action space Box\("):
            shoal.train("sarsa", env=env_id, run_dir=str(tmp_path), **SMALL)
    finally:
        gym.registry.pop(env_id, None)


def test_env_without_time_limit_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="CliffWalking-v1 has no time limit"):
        shoal.train(
            "q-learning",
            env="CliffWalking-v1",
            run_dir=str(tmp_path),
            **{**SMALL, "env.max_episode_steps": None},
        )


# --- determinism and exact resume ---------------------------------------------------------------


# Dense rewards and episodes that span the checkpoint (default limit 200), so the Q table,
# the traces, the exploration generator and the envs mid-episode all have to be restored.
RESUME_CASES = [
    ("q-learning", "CliffWalking-v1"),
    ("sarsa", "Taxi-v4"),
    ("q-lambda", "Taxi-v4"),
    ("sarsa-lambda", "CliffWalking-v1"),
    ("expected-sarsa", "FrozenLake-v1"),
]


@pytest.mark.parametrize(("name", "env_id"), RESUME_CASES)
def test_resume_is_exact(name, env_id, tmp_path, capsys):
    overrides = {
        **SMALL,
        "epsilon_decay_steps": 5 * ITERATION_STEPS,
        "run.eval_every_steps": 2 * ITERATION_STEPS,
        "run.eval_episodes": 2,
        "run.checkpoint_every_steps": ITERATION_STEPS,
    }
    first, total = 3 * ITERATION_STEPS, 5 * ITERATION_STEPS
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    part = shoal.train(name, env=env_id, seed=3, total_steps=first, run_dir=a, **overrides)
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    straight = shoal.train(name, env=env_id, seed=3, total_steps=total, run_dir=b, **overrides)
    assert "could not be restored" not in capsys.readouterr().out
    assert resumed.env_steps == straight.env_steps == total
    got, want = load_checkpoint(resumed.run_dir).state, load_checkpoint(straight.run_dir).state
    assert_states_equal(got["algorithm"], want["algorithm"])
    assert got["algorithm"]["env"] is not None  # the toy-text envs resume mid-episode

    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)
    # A different seed explores differently.
    other = shoal.train(name, env=env_id, seed=4, total_steps=total, run_dir=a + "c", **overrides)
    assert metric_rows(other.run_dir) != metric_rows(straight.run_dir)


# --- command line -------------------------------------------------------------------------------

CLI_SMALL = ["--env.num-envs", "4", "--steps-per-iteration", "8", "--run.eval-every-steps", "0",
             "--run.no-console", "--run.no-tensorboard"]  # fmt: skip


def test_cli_train_eval_and_generic_name(tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = ["train", "q-learning", "--env", "CliffWalking-v1", "--alpha", "0.5",
            "--total-steps", "64", "--run-dir", str(run_dir), *CLI_SMALL]  # fmt: skip
    assert main(args) == 0
    assert "training q-learning on CliffWalking-v1" in capsys.readouterr().out
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["method"] == "q_learning" and saved["alpha"] == 0.5
    assert main(["eval", str(run_dir), "--episodes", "3"]) == 0
    assert "3 episodes on CliffWalking-v1: return" in capsys.readouterr().out
    assert main(["eval", str(run_dir), "--episodes", "2", "--stochastic"]) == 0

    other = tmp_path / "generic"
    args = ["train", "tabular", "--method", "expected_sarsa", "--env", "Taxi-v4",
            "--total-steps", "64", "--run-dir", str(other), *CLI_SMALL]  # fmt: skip
    assert main(args) == 0
    assert load_checkpoint(other).meta["algo"] == "expected-sarsa"
    assert main(["train", "--resume", str(other), "--total-steps", "128"]) == 0
    assert "step_000000000128" in capsys.readouterr().out
