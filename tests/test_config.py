"""Config validation, from_dict, replace and the tuned examples."""

import importlib.util
import re
from pathlib import Path

import gymnasium as gym
import pytest

from shoal.algos.cores.offline import FROM_DATASET
from shoal.algos.policy_gradient.ppo import PPOConfig
from shoal.config import (
    EnvConfig,
    ModelConfig,
    OptimConfig,
    RenamedFieldWarning,
    ReplayConfig,
    RunConfig,
    from_dict,
    replace,
    to_dict,
)
from shoal.core.errors import ConfigError
from shoal.envs import env_spec
from shoal.envs.games import make_game
from shoal.envs.multi_agent import PETTINGZOO_PREFIX, is_multi_agent_id, multi_agent_ids
from shoal.registry import algorithm_for_config, find_tuned, get_algorithm, tuned_examples
from shoal.studies.datasets import RECIPES

# (config class, keyword arguments, qualified field name, allowed-range text)
INVALID = [
    (RunConfig, {"seed": -1}, "RunConfig.seed", ">= 0"),
    (RunConfig, {"total_steps": 0}, "RunConfig.total_steps", "> 0"),
    (RunConfig, {"eval_episodes": 0}, "RunConfig.eval_episodes", "> 0"),
    (RunConfig, {"keep_checkpoints": 0}, "RunConfig.keep_checkpoints", "> 0"),
    (RunConfig, {"torch_threads": 0}, "RunConfig.torch_threads", "> 0"),
    (RunConfig, {"eval_every_steps": -1}, "RunConfig.eval_every_steps", ">= 0"),
    (RunConfig, {"checkpoint_every_steps": -5}, "RunConfig.checkpoint_every_steps", ">= 0"),
    (RunConfig, {"max_wall_s": 0.0}, "RunConfig.max_wall_s", "> 0"),
    (RunConfig, {"device": "gpu"}, "RunConfig.device", "must be auto, cpu, cuda or cuda:N"),
    (EnvConfig, {"id": ""}, "EnvConfig.id", "must name an environment"),
    (EnvConfig, {"num_envs": 0}, "EnvConfig.num_envs", "> 0"),
    (EnvConfig, {"clip_obs": 0.0}, "EnvConfig.clip_obs", "> 0"),
    (EnvConfig, {"clip_reward": -1.0}, "EnvConfig.clip_reward", "> 0"),
    (EnvConfig, {"gamma": 1.5}, "EnvConfig.gamma", "[0, 1]"),
    (EnvConfig, {"max_episode_steps": 0}, "EnvConfig.max_episode_steps", "> 0"),
    (EnvConfig, {"vectorization": "threads"}, "EnvConfig.vectorization", "'sync'"),
    (OptimConfig, {"lr": 0.0}, "OptimConfig.lr", "> 0"),
    (OptimConfig, {"eps": -1e-8}, "OptimConfig.eps", "> 0"),
    (OptimConfig, {"weight_decay": -0.1}, "OptimConfig.weight_decay", ">= 0"),
    (OptimConfig, {"max_grad_norm": 0.0}, "OptimConfig.max_grad_norm", "> 0"),
    (OptimConfig, {"anneal_steps": 0}, "OptimConfig.anneal_steps", "> 0"),
    (OptimConfig, {"lr_schedule": "cosine"}, "OptimConfig.lr_schedule", "'linear'"),
    (ModelConfig, {"hidden": (64, 0)}, "ModelConfig.hidden", "> 0"),
    (ModelConfig, {"temperature": 0.0}, "ModelConfig.temperature", "> 0"),
    (ModelConfig, {"activation": "gelu"}, "ModelConfig.activation", "'tanh'"),
    (PPOConfig, {"clip_eps": -1.0}, "PPOConfig.clip_eps", "> 0"),
    (PPOConfig, {"num_steps": 0}, "PPOConfig.num_steps", "> 0"),
    (PPOConfig, {"num_epochs": 0}, "PPOConfig.num_epochs", "> 0"),
    (PPOConfig, {"minibatch_size": 0}, "PPOConfig.minibatch_size", "> 0"),
    (PPOConfig, {"gamma": -0.1}, "PPOConfig.gamma", "[0, 1]"),
    (PPOConfig, {"gae_lambda": 1.01}, "PPOConfig.gae_lambda", "[0, 1]"),
    (PPOConfig, {"vf_coef": -1.0}, "PPOConfig.vf_coef", ">= 0"),
    (PPOConfig, {"kl_coeff": -0.2}, "PPOConfig.kl_coeff", ">= 0"),
    (PPOConfig, {"kl_target": 0.0}, "PPOConfig.kl_target", "> 0"),
    (PPOConfig, {"value_clip": 0.0}, "PPOConfig.value_clip", "> 0"),
    (PPOConfig, {"target_kl": -0.01}, "PPOConfig.target_kl", "> 0"),
    (PPOConfig, {"clip_schedule": "cosine"}, "PPOConfig.clip_schedule", "'constant'"),
]


@pytest.mark.parametrize(
    ("cls", "kwargs", "field", "allowed"),
    INVALID,
    ids=[f"{field}={next(iter(kw.values()))!r}" for _, kw, field, _ in INVALID],
)
def test_invalid_values_name_the_field_and_range(cls, kwargs, field, allowed):
    with pytest.raises(ConfigError) as info:
        cls(**kwargs)
    message = str(info.value)
    assert message.startswith(f"{field} = "), message
    assert allowed in message, message
    assert repr(next(iter(kwargs.values()))) in message  # the offending value is shown


def test_config_error_is_a_value_error():
    with pytest.raises(ValueError):
        RunConfig(total_steps=0)


def test_minibatch_larger_than_rollout():
    env = EnvConfig(num_envs=4)
    with pytest.raises(ConfigError, match=r"PPOConfig\.minibatch_size = 65 .*<= .*= 64"):
        PPOConfig(env=env, num_steps=16, minibatch_size=65)
    assert PPOConfig(env=env, num_steps=16, minibatch_size=64).minibatch_size == 64


def test_boundary_values_are_valid():
    RunConfig(seed=0, eval_every_steps=0, checkpoint_every_steps=0)
    EnvConfig(gamma=0.0)
    EnvConfig(gamma=1.0)
    OptimConfig(weight_decay=0.0, max_grad_norm=None)
    PPOConfig(gamma=1.0, gae_lambda=0.0, vf_coef=0.0, kl_coeff=0.0)


def test_ppo_defaults_are_the_common_settings():
    config = PPOConfig()
    assert config.num_steps * config.env.num_envs == 2048
    assert (config.num_epochs, config.minibatch_size, config.optim.lr) == (10, 64, 3e-4)
    assert config.minibatch_size <= config.num_steps * config.env.num_envs


def test_from_dict_builds_nested_configs():
    data = {
        "run": {"seed": 3, "total_steps": 5000, "target_return": 475},
        "env": {"id": "Pendulum-v1", "num_envs": 4, "max_episode_steps": None},
        "optim": {"lr": 1, "max_grad_norm": None, "lr_schedule": "linear"},
        "model": {"hidden": [32, 16], "activation": "relu"},
        "num-steps": 32,  # dashes as in CLI flags
        "minibatch_size": 64,
        "value_clip": 1,
    }
    config = from_dict(PPOConfig, data)
    assert isinstance(config.run, RunConfig) and config.run.seed == 3
    assert config.run.total_steps == 5000
    assert config.run.target_return == 475.0 and isinstance(config.run.target_return, float)
    assert config.env == EnvConfig(id="Pendulum-v1", num_envs=4)
    assert config.optim.lr == 1.0 and isinstance(config.optim.lr, float)
    assert config.optim.max_grad_norm is None
    assert config.model.hidden == (32, 16) and isinstance(config.model.hidden, tuple)
    assert config.num_steps == 32
    assert config.value_clip == 1.0 and isinstance(config.value_clip, float)
    # Untouched fields keep their (algorithm-specific) defaults.
    assert config.gamma == 0.99
    assert config.run.eval_episodes == RunConfig().eval_episodes


def test_from_dict_round_trips_to_dict():
    config = PPOConfig(model=ModelConfig(hidden=(8, 8)), target_kl=0.02)
    assert from_dict(PPOConfig, to_dict(config)) == config


@pytest.mark.parametrize(
    ("data", "where", "suggestion"),
    [
        ({"num_step": 8}, "'num_step'", "num_steps"),
        ({"env": {"num_env": 8}}, "'env.num_env'", "num_envs"),
        ({"optim": {"learning_rate": 0.1}}, "'optim.learning_rate'", None),
        ({"model": {"hiden": [8]}}, "'model.hiden'", "hidden"),
    ],
)
def test_from_dict_rejects_unknown_keys_with_did_you_mean(data, where, suggestion):
    with pytest.raises(ConfigError) as info:
        from_dict(PPOConfig, data)
    message = str(info.value)
    assert f"unknown config field {where}" in message
    if suggestion:
        assert re.search(rf"did you mean .*\b{suggestion}\b", message), message
    else:
        assert "did you mean" not in message


def test_from_dict_requires_mappings():
    with pytest.raises(ConfigError, match="env must be a mapping"):
        from_dict(PPOConfig, {"env": "CartPole-v1"})
    with pytest.raises(ConfigError, match="must be a mapping"):
        from_dict(PPOConfig, ["num_steps", 8])


def test_from_dict_validates_values():
    with pytest.raises(ConfigError, match=r"EnvConfig\.num_envs"):
        from_dict(PPOConfig, {"env": {"num_envs": 0}})
    with pytest.raises(ConfigError, match=r"ModelConfig\.activation"):
        from_dict(PPOConfig, {"model": {"activation": "gelu"}})


def test_replace_with_dotted_keys():
    config = PPOConfig()
    new = replace(config, **{"env.id": "Pendulum-v1", "run.seed": 7, "clip_eps": 0.1})
    assert new.env.id == "Pendulum-v1" and new.env.num_envs == config.env.num_envs
    assert new.run.seed == 7 and new.run.total_steps == config.run.total_steps
    assert new.clip_eps == 0.1
    assert config.env.id == "CartPole-v1" and config.run.seed == 0  # the original is untouched
    deeper = replace(new, **{"optim.lr": 0.5, "optim.anneal_steps": 10})
    assert deeper.optim == OptimConfig(lr=0.5, anneal_steps=10)


def test_replace_validates():
    with pytest.raises(ConfigError, match=r"RunConfig\.total_steps"):
        replace(PPOConfig(), **{"run.total_steps": 0})
    with pytest.raises(ConfigError, match=r"PPOConfig\.minibatch_size"):
        replace(PPOConfig(), **{"env.num_envs": 1, "num_steps": 32})  # a rollout of 32 < 64
    with pytest.raises(ConfigError, match="no_such_field"):
        replace(PPOConfig(), **{"env.no_such_field": 1})
    with pytest.raises(ConfigError, match="did you mean num_epochs"):
        replace(PPOConfig(), num_epoch=3)


@pytest.mark.extra("atari", "mujoco", "pettingzoo")
def test_tuned_examples_load_and_build_valid_configs():
    examples = tuned_examples()
    assert "ppo-cartpole" in examples
    for name, example in examples.items():
        assert example.name == name
        assert example.description and example.expected, name
        config = example.build_config()
        assert isinstance(config, get_algorithm(example.algo).config_cls), name
        assert algorithm_for_config(config).name == example.algo, name
        # The environment must exist (env_spec raises UnknownEnvError otherwise).
        if config.env.id.startswith("openspiel:"):  # a game searched by AlphaZero
            assert make_game(config.env.id).num_actions > 0, name
        elif config.env.id == FROM_DATASET:  # an offline learner: a recipe makes its dataset
            assert config.dataset == f"datasets/{Path(config.dataset).name}", name
            assert Path(config.dataset).name in RECIPES, name
        elif config.env.id.startswith(PETTINGZOO_PREFIX):  # the module must be importable
            assert importlib.util.find_spec(config.env.id[len(PETTINGZOO_PREFIX) :]), name
        elif is_multi_agent_id(config.env.id):
            assert config.env.id in multi_agent_ids(), name
        else:
            assert isinstance(env_spec(config.env.id), gym.envs.registration.EnvSpec)


def test_tuned_cartpole_contents():
    config = find_tuned("ppo-cartpole").build_config()
    assert config.env.id == "CartPole-v1"
    assert config.run.target_return == 475.0
    assert config.model.hidden == (64,) and config.model.activation == "relu"  # YAML list -> tuple


def test_unknown_tuned_example_suggests_close_names():
    with pytest.raises(ConfigError, match="ppo-cartpole"):
        find_tuned("ppo-cartpol")


def test_tuned_yaml_with_unknown_field_fails(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("algo: ppo\nconfig:\n  env:\n    num_env: 4\n")
    with pytest.raises(ConfigError, match=r"bad\.env\.num_env.*num_envs"):
        find_tuned(str(path)).build_config()


def test_yaml_blocks_start_from_the_algorithms_own_block_defaults():
    # DQNConfig's default optim block clips gradients at 10, not OptimConfig's 0.5; a YAML
    # block that sets only the learning rate must keep the rest of DQN's block.
    from shoal.algos.value.dqn import DQNConfig

    config = from_dict(DQNConfig, {"optim": {"lr": 0.01}, "model": {"hidden": [32]}})
    assert config.optim.lr == 0.01
    assert config.optim.max_grad_norm == DQNConfig().optim.max_grad_norm == 10.0
    assert config.model.activation == DQNConfig().model.activation == "relu"
    assert config.model.hidden == (32,)


def test_old_flat_replay_fields_land_in_the_replay_block():
    """Config files and overrides written for shoal 0.1's flat replay fields keep working, each
    old name with a warning naming the new one; today's block is not mistaken for one."""
    from shoal.algos.continuous.sac import SACConfig
    from shoal.algos.value.dqn import DQNConfig

    old = {"buffer_size": 500, "replay": "uniform", "save_replay": True, "n_step": 3}
    with pytest.warns(RenamedFieldWarning) as caught:
        config = from_dict(DQNConfig, {**old, "optim": {"lr": 0.01}})
    assert config.replay == ReplayConfig(buffer_size=500, prioritized="none", save=True, n_step=3)
    assert config.optim.lr == 0.01 and len(caught) == 4
    assert "config field 'replay' is now 'replay.prioritized'" in str(caught[1].message)
    with pytest.warns(RenamedFieldWarning):
        assert replace(SACConfig(), batch_size=64).replay.batch_size == 64
    config = from_dict(DQNConfig, {"replay": {"prioritized": "rank", "n_step": 2}})  # no warning
    assert config.replay.prioritized == "rank" and config.replay.n_step == 2
    with pytest.raises(ConfigError, match="unknown config field 'replay.bufer_size'"):
        from_dict(DQNConfig, {"replay": {"bufer_size": 5}})


def test_old_encoder_and_atari_names_are_read_as_the_new_ones():
    """The options once named after a reference number (``ref001-*``) have names that say
    what they are; the old ones still work everywhere a config is written, with a warning
    naming the new one."""
    from shoal.algos.policy_gradient.ppo import PPOConfig
    from shoal.cli.train import renamed_flags

    old = {"env": {"atari": "ref001-stack"}, "model": {"encoder": "ref001-model3"}}
    with pytest.warns(RenamedFieldWarning) as caught:
        config = from_dict(PPOConfig, old)
    assert "'ref001-stack' is now 'crop80-stack'" in str(caught[0].message)
    assert config.env.atari == "crop80-stack" and config.model.encoder == "batchnorm-cnn3-lstm"
    assert config.model.lstm_hidden == 256  # the CNN + LSTM model, as before
    with pytest.warns(RenamedFieldWarning):
        assert replace(PPOConfig(), **{"env.atari": "ref001-diff"}).env.atari == "crop80-diff"
    with pytest.warns(RenamedFieldWarning):
        assert ModelConfig(encoder="ref001-model2").encoder == "batchnorm-cnn2"
    with pytest.warns(RenamedFieldWarning):
        argv = renamed_flags(PPOConfig, ["--env.atari", "ref001-stack", "--seed", "3"])
    assert argv == ["--env.atari", "crop80-stack", "--seed", "3"]
    assert renamed_flags(PPOConfig, ["--env.atari", "deepmind"]) == ["--env.atari", "deepmind"]


def test_a_checkpoint_with_the_old_field_names_loads_and_resumes(tmp_path):
    """A run directory written before the replay block (its config.json flat) resumes."""
    import json

    import shoal

    overrides = {
        "env.num_envs": 2,
        "rollout_steps": 8,
        "replay.learning_starts": 8,
        "replay.batch_size": 4,
        "model.hidden": (8,),
        "run.eval_every_steps": 0,
        "run.console": False,
        "run.tensorboard": False,
    }
    result = shoal.train("dqn", total_steps=32, run_dir=str(tmp_path / "run"), **overrides)
    for path in (result.checkpoint / "config.json", result.run_dir / "config.json"):
        config = json.loads(path.read_text())
        replay = config.pop("replay")
        # the fields of the time (max_lag came later, in the replay block)
        old = {k: v for k, v in replay.items() if k not in ("prioritized", "save", "max_lag")}
        config.update(old)
        config.update(replay="uniform", save_replay=replay["save"])
        path.write_text(json.dumps(config))
    with pytest.warns(RenamedFieldWarning):
        policy = shoal.load(result.run_dir)
    assert policy.config.replay.batch_size == 4
    with pytest.warns(RenamedFieldWarning):
        resumed = shoal.train(resume=result.run_dir, total_steps=64)
    assert resumed.env_steps == 64


@pytest.mark.parametrize(
    "values, message",
    [
        ({"num_epochs": "four"}, "PPOConfig.num_epochs must be an integer, got 'four' (str)"),
        ({"num_epochs": 2.5}, "PPOConfig.num_epochs must be an integer"),
        ({"run": {"tensorboard": "yes"}}, "RunConfig.tensorboard must be"),
        ({"model": {"hidden": 64}}, "ModelConfig.hidden must be"),
        ({"model": {"activation": "gelu"}}, "ModelConfig.activation must be one of"),
        ({"optim": {"lr": "fast"}}, "OptimConfig.lr must be"),
    ],
)
def test_values_of_the_wrong_type_name_the_field_and_the_type(values, message):
    with pytest.raises(ConfigError) as exc:
        from_dict(PPOConfig, values)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_numbers_as_yaml_writes_them_are_accepted():
    config = from_dict(PPOConfig, {"optim": {"lr": "1e-3"}, "num_epochs": 4.0, "gamma": 1})
    assert config.optim.lr == 1e-3 and config.num_epochs == 4 and config.gamma == 1.0
    assert isinstance(config.num_epochs, int) and isinstance(config.gamma, float)
    assert from_dict(PPOConfig, {"model": {"hidden": [32, 32]}}).model.hidden == (32, 32)
