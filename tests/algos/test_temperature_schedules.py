"""Every on-policy algorithm with a categorical head anneals the softmax temperature alike."""

import pytest

import shoal
from shoal.train.checkpoint import load_checkpoint

SMALL = {
    "env.num_envs": 4,
    "num_steps": 16,
    "model.hidden": (8,),
    "model.temperature": 2.0,
    "model.temperature_min": 0.5,
    "model.temperature_anneal": 256,
    "run.eval_every_steps": 0,
    "run.checkpoint_every_steps": 0,
    "run.console": False,
    "run.tensorboard": False,
}


@pytest.mark.parametrize("algo", ["ppo", "a2c", "pg", "trpo"])
def test_temperature_anneals_by_env_steps_and_reaches_the_sampler(algo, tmp_path):
    seen = []
    overrides = dict(SMALL)
    if algo == "ppo":
        overrides["minibatch_size"] = 32
    if algo == "trpo":
        overrides["vf_minibatch_size"] = 32
    result = shoal.train(
        algo,
        run_dir=str(tmp_path / algo),
        total_steps=5 * 64,
        on_iteration=lambda step, metrics: seen.append(metrics["train/temperature"]),
        **overrides,
    )
    # The rollout of iteration i is sampled after 64 * i env steps: 2 -> 0.5 over 256 steps.
    assert seen == pytest.approx([2.0, 1.625, 1.25, 0.875, 0.5])
    weights = load_checkpoint(result.run_dir).state["algorithm"]["policy"]["model"]
    assert weights["policy_head.temperature"].item() == pytest.approx(0.5)


def test_a_constant_temperature_is_set_at_the_start_and_again_after_a_restore():
    """Without a schedule the temperature is set once (not at every broadcast), and again
    when a checkpoint brings another value: the configured constant wins, in the learner and
    in the sampler's copy."""
    from shoal.api import build_config
    from shoal.registry import algorithm_for_config

    constant = {k: v for k, v in SMALL.items() if not k.startswith("model.temperature")}

    def build(temperature):
        config = build_config("a2c", **constant, **{"model.temperature": temperature})
        return algorithm_for_config(config).algorithm_cls(config)

    def temperatures(algorithm):
        runner_model = algorithm.sampler.runner.model
        models = (algorithm.learner.model, runner_model)
        return [m.policy_head.temperature.item() for m in models]

    first = build(2.0)
    first.train_iteration()
    assert temperatures(first) == [2.0, 2.0]
    second = build(0.5)
    second.load_state_dict(first.state_dict())  # a checkpoint saved at 2.0
    assert temperatures(second) == [0.5, 0.5]
    second.train_iteration()
    assert temperatures(second) == [0.5, 0.5]
    first.close()
    second.close()
