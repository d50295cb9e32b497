"""No setting is accepted and then ignored: every registered algorithm trains (two short
iterations, an evaluation, a checkpoint, a load), recording the config fields its code
reads, and each field it does not read must be declared (`shoal.config.usage`): unused by
that algorithm, read only behind a gate its config keeps closed, or read only on envs whose
spaces call for it. Declared fields other than the last kind are refused when set, and a
field declared unused must really go unread."""

import dataclasses
import typing

import pytest
from config_reads import config_classes, recording, unread
from in_process_ray import use_in_process_ray

import shoal
from shoal.config import is_nested, replace
from shoal.config.usage import (
    SPACE_DEPENDENT,
    UnreadSettingWarning,
    check_usage,
    closed_gates,
    unused,
    value_at,
)
from shoal.core.errors import ConfigError
from shoal.registry import ALGORITHMS
from shoal.train.loop import run

REPLAY = {"replay.batch_size": 8, "replay.learning_starts": 8, "replay.buffer_size": 200,
          "replay.gradient_steps": 2}  # fmt: skip
EPISODES = {"env.num_envs": 4, "rollout_steps": 4, "replay.batch_size": 4,
            "replay.learning_starts": 4}  # fmt: skip
TABULAR = {"env.num_envs": 4, "steps_per_iteration": 8}
APEX = {"run.runners": 1, "replay_shards": 1, "rollout_steps": 4, "env.num_envs": 2}
SMOKE: dict[str, dict[str, typing.Any]] = {
    "ppo": {"env.num_envs": 4, "num_steps": 8, "minibatch_size": 16, "num_epochs": 2},
    "mappo": {"env.id": "shoal/spread-v0", "env.num_envs": 2, "num_steps": 8,
              "minibatch_size": 16},
    "ippo": {"env.id": "shoal/spread-v0", "env.num_envs": 2, "num_steps": 8,
             "minibatch_size": 16},
    "maddpg": {"env.num_envs": 2, "rollout_steps": 4, **REPLAY},
    "ctedd": {"env.num_envs": 2, "rollout_steps": 4, "distill_every": 16, **REPLAY},
    "pg": {"env.num_envs": 4, "num_steps": 32},
    "a2c": {"env.num_envs": 4, "num_steps": 8},
    "acer": {"env.num_envs": 4, "num_steps": 8, "replay.learning_starts": 32},
    "acktr": {"env.num_envs": 4, "num_steps": 8},
    "trpo": {"env.num_envs": 4, "num_steps": 8, "vf_minibatch_size": 16},
    "dqn": {"env.num_envs": 2, "rollout_steps": 4, "target_update_every": 2, **REPLAY},
    "qrdqn": {"env.num_envs": 2, "rollout_steps": 4, "target_update_every": 2, **REPLAY},
    "rem": {"env.num_envs": 2, "rollout_steps": 4, "target_update_every": 2, **REPLAY},
    "ddpg": {"env.num_envs": 2, "rollout_steps": 4, **REPLAY},
    "td3": {"env.num_envs": 2, "rollout_steps": 4, **REPLAY},
    "sac": {"env.num_envs": 2, "rollout_steps": 4, **REPLAY},
    "d4pg": {"env.num_envs": 2, "rollout_steps": 4, "num_atoms": 11, **REPLAY},
    "bc": {"replay.batch_size": 8},
    "cql": {"replay.batch_size": 8, "action_samples": 2},
    "iql-offline": {"replay.batch_size": 8},
    "td3-bc": {"replay.batch_size": 8},
    **{name: TABULAR for name in ("q-learning", "sarsa", "expected-sarsa", "sarsa-lambda",
                                  "q-lambda", "tabular")},  # fmt: skip
    "qmix": EPISODES,
    "vdn": EPISODES,
    "iql": EPISODES,
    "impala": {"env.num_envs": 4, "num_steps": 8},
    "a3c": {"env.num_envs": 4, "a2c.num_steps": 8},
    "ddppo": {"num_learners": 1, "env.num_envs": 4, "ppo.num_steps": 8,
              "ppo.minibatch_size": 16},
    "appo": {"env.num_envs": 4, "ppo.num_steps": 8, "ppo.minibatch_size": 16},
    "r2d2": {"env.num_envs": 4, "num_steps": 8, "burn_in": 2, "length": 4, "period": 2,
             "model.lstm_hidden": 8, **REPLAY},
    "apex-dqn": {**APEX, "dqn.replay.batch_size": 8, "dqn.replay.learning_starts": 8},
    "apex-ddpg": {**APEX, "training_intensity": 8.0, "ddpg.replay.batch_size": 8,
                  "ddpg.replay.learning_starts": 8},
    "apex-r2d2": {"run.runners": 1, "replay_shards": 1, "env.num_envs": 2,
                  "r2d2.burn_in": 2, "r2d2.length": 4, "r2d2.period": 2,
                  "r2d2.model.lstm_hidden": 8, "r2d2.replay.batch_size": 4,
                  "r2d2.replay.learning_starts": 8},
    "maddpg-distributed": {"run.runners": 1, "env.num_envs": 2, "maddpg.rollout_steps": 4,
                           "maddpg.replay.batch_size": 8,
                           "maddpg.replay.learning_starts": 8},
    "es": {"episodes_per_batch": 8, "train_batch_size": 1, "model.hidden": (8,)},
    "ars": {"num_rollouts": 4, "rollouts_used": 2},
    "ga": {"population": 6, "truncation": 2, "elite_candidates": 2, "elite_episodes": 2,
           "model.hidden": (8,)},
    "cmaes": {"popsize": 6, "model.hidden": (4,)},
    "alphazero": {"env.num_envs": 2, "search.num_simulations": 4, "moves_per_iteration": 4,
                  "min_replay": 8, "batch_size": 8, "eval_every": 1, "eval_games": 2},
    "muzero": {"env.num_envs": 2, "search.num_simulations": 4, "steps_per_iteration": 16,
               "min_replay": 8, "batch_size": 8, "model.hidden": (8,),
               "run.total_steps": 128},
    "mcts": {"env.num_envs": 2, "search.num_simulations": 4, "rollout_steps": 4},
}  # fmt: skip
EXTRA = {"alphazero": "openspiel", "cmaes": "cma", **{n: "offline" for n in ("bc", "cql",
         "iql-offline", "td3-bc")}}  # fmt: skip
NAMES = [pytest.param(n, marks=pytest.mark.extra(EXTRA[n])) if n in EXTRA else n
         for n in sorted(ALGORITHMS)]  # fmt: skip


def test_every_algorithm_has_a_smoke_config():
    assert sorted(SMOKE) == sorted(ALGORITHMS)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "pendulum"
    shoal.collect(out, env="Pendulum-v1", episodes=2, num_envs=2)
    return out


def smoke_config(name: str, tmp_path, dataset_dir=None) -> typing.Any:
    spec = ALGORITHMS[name]
    base = spec.default_config()
    total = 64
    settings = {
        "run.total_steps": total,
        "run.console": False,
        "run.tensorboard": False,
        "run.checkpoint_every_steps": total // 2,
        "run.run_dir": str(tmp_path / "run"),
    }
    evaluates = name not in ("alphazero", "mcts")  # matches and planned episodes instead
    if evaluates:
        settings |= {"run.eval_every_steps": total // 2, "run.eval_episodes": 2}
    if spec.prepare is not None:  # an offline learner
        settings |= {
            "dataset": str(dataset_dir),
            "run.total_steps": 8,
            "run.eval_every_steps": 4,
            "run.checkpoint_every_steps": 4,
        }
    return spec.default_config(**{**settings, **SMOKE[name]}), base


@pytest.mark.parametrize("name", NAMES)
def test_every_field_is_read_or_declared(name, tmp_path, monkeypatch, request):
    spec = ALGORITHMS[name]
    dataset_dir = request.getfixturevalue("dataset") if spec.prepare is not None else None
    use_in_process_ray(monkeypatch)
    config, _ = smoke_config(name, tmp_path, dataset_dir)
    built: list[typing.Any] = []
    keeping = dataclasses.replace(
        spec, algorithm_cls=lambda c: built.append(spec.algorithm_cls(c)) or built[-1]
    )
    with recording(config_classes(config)) as reads:
        result = run(keeping, config)
        if spec.deploys:
            shoal.load(result.run_dir)
    # The capabilities the spec declares are what the algorithm has (the session reads them
    # because they are declared, and only then).
    has = {
        "acts_jointly": "joint",
        "own_spaces": "deploy_spaces",
        "extra_evaluation": "eval_metrics",
    }
    assert {k: hasattr(built[0], v) for k, v in has.items()} == {
        k: getattr(spec, k) for k in has
    }, f"{name}'s spec declares other capabilities than its algorithm has"
    declared = {**closed_gates(config), **unused(config)}

    def exempt(path: str) -> bool:
        return (path in declared or path in SPACE_DEPENDENT
                or path.split(".", 1)[-1] in SPACE_DEPENDENT
                or in_nested_run_or_env(config, path))  # fmt: skip

    missing = [p for p in unread(config, reads) if not exempt(p)]
    assert not missing, f"{name} never reads {missing}: honour them, or declare them"
    stale = [p for p in unused(config) if p not in unread(config, reads)]
    assert not stale, f"{name} reads {stale}, which its config declares unused"


def in_nested_run_or_env(config: typing.Any, path: str) -> bool:
    """A field of a variant's nested block's run or env (DD-PPO's ppo.run, Ape-X's dqn.env):
    the variant reads its own top-level ones, and refuses these when set
    (`shoal.config.check_block`)."""
    head, *rest = path.split(".")
    block = getattr(config, head)
    return bool(rest) and is_nested(block) and rest[0] in ("run", "env")


def changed(config: typing.Any, path: str) -> typing.Any:
    """Another valid-looking value for the field at ``path``."""
    *parents, name = path.split(".")
    block = value_at(config, ".".join(parents)) if parents else config
    hint = typing.get_type_hints(type(block))[name]
    value = getattr(block, name)
    options = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Literal:
        return next(c for c in options if c != value)
    if value is None:
        hint = options[0]
        return {int: 7, float: 0.5, str: "x"}.get(hint, 7)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):  # toward 1 within (0, 1), where probabilities live
        return (value + 1) / 2 if 0 < value < 1 else (value * 0.5 if value else 0.5)
    if isinstance(value, tuple):
        item = (typing.get_args(hint) or (int,))[0]
        return (*value, "ClipAction" if item is str else 3)
    if isinstance(value, dict):
        return {**value, "x": "y"}
    return "mymodule:MyClass"  # a user's class: the form free-text fields take


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_declared_fields_are_refused_or_named_when_set(name, tmp_path):
    """A field the algorithm never reads is refused; one behind a closed gate is named in a
    warning (a tuned example's setting may stay behind when another setting closes its
    gate: it takes effect again when the gate opens)."""
    spec = ALGORITHMS[name]
    config, base = smoke_config(name, tmp_path, tmp_path / "data")
    own = [path for path in unused(config) if not in_nested_run_or_env(config, path)]
    gated = [
        p for p in closed_gates(config) if p not in own and not in_nested_run_or_env(config, p)
    ]
    for path in own:  # refused by check_usage, or already by the config's own checks
        with pytest.raises(ConfigError, match=rf"\.{path.rsplit('.', 1)[-1]}\b"):
            check_usage(replace(config, **{path: changed(config, path)}), base, spec.name)
    for path in gated:
        with pytest.warns(UnreadSettingWarning, match=rf"\.{path.rsplit('.', 1)[-1]} = .* no "):
            check_usage(replace(config, **{path: changed(config, path)}), base, spec.name)


def test_a_refusal_names_the_field_and_its_default(tmp_path):
    base = ALGORITHMS["dqn"].default_config()
    with pytest.warns(UnreadSettingWarning, match=r"DQNConfig.num_atoms = 21 has no effect in "
                      r"this run of dqn: it is read only with value_head c51"):  # fmt: skip
        check_usage(replace(base, num_atoms=21), base, "dqn")
    with pytest.raises(ConfigError, match=r"SACConfig.model.shared_trunk = True is not read by "
                       r"sac: its actor and critics are separate networks; leave it at its "
                       r"default \(False\)"):  # fmt: skip
        shoal.train("sac", run_dir=str(tmp_path / "r"),
                    **{"model.shared_trunk": True, "run.console": False})  # fmt: skip
    assert not (tmp_path / "r").exists()


def test_every_declaration_names_a_field():
    for spec in ALGORITHMS.values():
        config = spec.default_config()
        for path in {**closed_gates(config), **unused(config)}:
            value_at(config, path)  # raises AttributeError for a misspelled declaration
        for cls in {type(b) for b in [config]} | {
            type(getattr(config, f.name)) for f in dataclasses.fields(config)
        }:
            for gate in getattr(cls, "GATES", {}).values():
                assert gate is None or gate.words


def test_no_tuned_example_sets_what_its_algorithm_does_not_read():
    """A tuned example is a config a user copies: it sets nothing that would be refused or
    that has no effect (acer-pong's shared_trunk did nothing: ACER always shares one)."""
    import warnings

    from shoal.registry import get_algorithm, tuned_examples

    for name, example in tuned_examples().items():
        spec = get_algorithm(example.algo)
        with warnings.catch_warnings():
            warnings.simplefilter("error", UnreadSettingWarning)
            try:
                check_usage(example.build_config(), spec.default_config(), spec.name)
            except (ConfigError, UnreadSettingWarning) as exc:
                raise AssertionError(f"tuned example {name}: {exc}") from exc
