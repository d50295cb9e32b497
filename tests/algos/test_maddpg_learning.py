"""Fixed-seed learning tests of MADDPG and MADDPG with prioritized replay on the built-in
cooperative navigation: both clearly beat random actions within a CI-sized budget."""

import pytest
from random_policy import RandomPolicy

import shoal
from shoal.collect.evaluate import evaluate
from shoal.config import EnvConfig

pytestmark = pytest.mark.learning

MARGIN = 5.0
"""Required gain in mean per-agent return over uniformly random actions after 30k env steps,
on the first episode of 64 evaluation envs (random actions: -25.2 here, about -26.1 over 4096
envs)."""


@pytest.mark.parametrize(
    "tuned",
    # PER's variant (about 50 s beside the other tests) in the slow tier; plain MADDPG in CI.
    ["maddpg-spread", pytest.param("maddpg-per-spread", marks=pytest.mark.slow)],
)
def test_maddpg_beats_random_on_spread(tuned, tmp_path):
    env = shoal.make_env(EnvConfig(id="shoal/spread-v0", num_envs=64))
    random_return = evaluate(RandomPolicy(5, seed=1), env, seed=2024)["eval/return"]
    result = shoal.train(
        tuned=tuned,
        seed=0,
        run_dir=str(tmp_path / "run"),
        total_steps=30_000,
        **{"run.eval_every_steps": 0, "run.checkpoint_every_steps": 0, "run.console": False,
           "run.tensorboard": False},
    )  # fmt: skip
    trained = evaluate(shoal.load(result.run_dir), env, seed=2024)["eval/return"]
    env.close()
    print(f"{tuned}: random {random_return:.2f}, trained {trained:.2f}")
    assert trained >= random_return + MARGIN, (trained, random_return)
