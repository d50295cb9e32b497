"""CTEDD learns (Chen 2019): with a fixed seed and 10k env steps each (~12 s apiece on one
core), the global policies beat a uniformly random policy and the distilled local policies
keep a stated share of that gain.

The share is ``(L - random) / (G - random)``: 1 means the local policies (CTEDD-L-1) score as
the deterministic global ones (CTEDD-G), 0 as random actions (returns are negative, so a ratio
of returns would mislead). Measured at these settings (seeds 0 and 1, 100 evaluation episodes):

* ``shoal/spread-v0`` (observations hold relative positions): G -22.1 / -21.8, L -24.0 / -23.6,
  random -26.4 / -26.7: share 0.57 / 0.64 (about 0.9 at 20k steps). The share depends on the
  machine's floating-point path: on an AMD EPYC host seeds 0 / 1 / 2 gave 0.41 / 1.23 / 0.33
  (G -21.0 / -22.7 / -21.6, L -24.2 / -21.7 / -24.7). Asserted: >= 0.25 (local policies
  clearly above random on every seed tried, with room for the machine-to-machine spread).
* ``shoal/cn-v1-v0`` (the paper's CN-V1: an agent observes only *distances*, which carry no
  direction, so no memoryless local policy can say which way to move; the local policies can
  only approximate the teacher's mean action per distance pattern): G -45.2 / -41.8, L -52.6 /
  -49.3, random -53.3 / -53.2: share 0.08 / 0.34. With the dependency floors (torch 2.7.1,
  NumPy 1.26) seed 0 gives G -43.3, L -54.7, random -54.5: share -0.01. The share sits
  within the evaluation's noise of zero, so no claim that the local policies beat random
  holds on one seed; distillation's learning test is spread's above. Asserted: G >= random
  + 5 (the global policies learn), and the local policies are evaluated end to end.
"""

import math

import pytest
import torch

from shoal.algos.multi_agent.ctedd import CTEDD, CTEDDConfig
from shoal.config import replace
from shoal.core.seeding import seed_torch

pytestmark = pytest.mark.learning

STEPS = 10_000


def train_and_score(env_id: str) -> tuple[float, float, float]:
    seed_torch(0)
    torch.set_num_threads(1)
    config = replace(
        CTEDDConfig(),
        **{
            "env.id": env_id,
            "run.seed": 0,
            "run.total_steps": STEPS,
            "env.num_envs": 8,
            "rollout_steps": 4,
            "replay.gradient_steps": 4,
            "distill_every": STEPS,
            "evaluate_rounds": False,
            "run.eval_episodes": 100,
        },
    )
    algo = CTEDD(config)
    try:
        while algo.env_steps < STEPS:
            algo.train_iteration()
        global_return = algo.evaluate_global(seed=7)
        local_return = algo.evaluate_local(seed=7)
        random_return = algo.evaluate_team(
            lambda obs, state: torch.rand(obs.shape[0], 3, 2) * 2 - 1, None, 7
        )
    finally:
        algo.close()
    return global_return, local_return, random_return


def test_distilled_policies_keep_a_share_of_the_gain_on_spread():
    g, local, rnd = train_and_score("shoal/spread-v0")
    assert g > rnd
    assert (local - rnd) / (g - rnd) >= 0.25, (g, local, rnd)


def test_global_policies_learn_cn_v1():
    g, local, rnd = train_and_score("shoal/cn-v1-v0")
    assert g >= rnd + 5.0, (g, rnd)
    assert math.isfinite(local), local  # distilled and evaluated; its share is noise-level
