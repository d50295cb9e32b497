"""Every registered algorithm has a smoke test (a short run, checked), a resume test and a
fixed-seed learning test whose threshold a random policy cannot reach. The table below names
them; this file fails when an algorithm is registered without an entry, or when a test it
names is gone. Resumes are exact (equal to an unbroken run) except where noted: Ape-X and
distributed MADDPG interleave actors and learners by timing, so their resumes go on from the
checkpoint. Learning tests in the ``slow`` tier run with ``make test-slow``, the others with
``make test-learning`` (CI)."""

import re
from pathlib import Path

import pytest

from shoal.registry import ALGORITHMS

TESTS = Path(__file__).parent


def named(path: str, *names: str) -> tuple[str, ...]:
    """``path::name`` for each test function ``name`` of ``path`` (under tests/)."""
    return tuple(f"{path}::{name}" for name in names)


TABULAR = named("algos/test_tabular.py", "test_smoke", "test_resume_is_exact") + named(
    "algos/test_tabular_learning.py", "test_every_method_solves_nonslippery_frozenlake"
)
OFFLINE = named("algos/test_offline.py", "test_smoke_never_steps_a_training_env",
                "test_resume_is_exact")  # fmt: skip
QMIX = named("algos/test_qmix.py", "test_smoke_train_evaluate_load",
             "test_resume_with_saved_replay_is_exact") + named(
    "algos/test_qmix_learning.py", "test_two_step_game")  # fmt: skip
DQN = named("algos/test_dqn.py", "test_smoke_every_switch",
            "test_resume_with_saved_replay_is_exact") + named(
    "algos/test_dqn_learning.py", "test_tuned_example_solves_cartpole")  # fmt: skip
OFF_POLICY = named("algos/test_continuous_control.py", "test_smoke_on_pendulum",
                   "test_resume_with_saved_replay_is_exact") + named(
    "algos/test_continuous_control_learning.py",
    "test_tuned_example_swings_pendulum_up")  # fmt: skip
EVOLUTION = named("algos/test_evolution.py", "test_smoke_evaluate_and_load", "test_resume_is_exact")
MULTI_AGENT_PPO = named("envs/test_agents_as_batch.py",
                        "test_multi_agent_ppo_counts_env_steps_and_logs_returns_per_agent",
                        "test_resume_is_exact")  # fmt: skip
TEAM_LEARNING = "algos/test_multi_agent_learning.py"
APEX, APEX_R2D2 = "distributed/test_apex.py", "distributed/test_apex_r2d2.py"

COVERAGE: dict[str, tuple[str, ...]] = {
    "ppo": named("algos/test_ppo.py", "test_ppo_smoke", "test_resume_is_exact")
    + named("algos/test_ppo_learning.py", "test_ppo_solves_cartpole"),
    "mappo": MULTI_AGENT_PPO + named(TEAM_LEARNING, "test_mappo_beats_random_on_spread"),
    "ippo": MULTI_AGENT_PPO
    + named("envs/test_turn_based.py",
            "test_pool_self_play_learns_both_seats_against_a_random_player"),
    "maddpg": named("algos/test_maddpg.py", "test_smoke", "test_resume_with_saved_replay_is_exact")
    + named("algos/test_maddpg_learning.py", "test_maddpg_beats_random_on_spread"),
    "ctedd": named("algos/test_ctedd.py", "test_smoke_trains_distills_and_exports",
                   "test_resume_is_exact")
    + named("algos/test_ctedd_learning.py", "test_global_policies_learn_cn_v1"),
    "pg": named("algos/test_pg.py", "test_pg_smoke", "test_resume_is_exact")
    + named("algos/test_pg_a2c_learning.py", "test_solves_cartpole"),
    "a2c": named("algos/test_a2c.py", "test_a2c_smoke", "test_resume_is_exact")
    + named("algos/test_pg_a2c_learning.py", "test_solves_cartpole"),
    "acer": named("algos/test_acer.py", "test_smoke", "test_resume_is_exact")
    + named("algos/test_corrections_learning.py", "test_solves_cartpole"),
    "acktr": named("algos/test_acktr.py", "test_smoke", "test_resume_is_exact")
    + named("algos/test_corrections_learning.py", "test_solves_cartpole"),
    "trpo": named("algos/test_trpo.py", "test_trpo_smoke", "test_resume_is_exact")
    + named("algos/test_trpo_learning.py", "test_trpo_solves_cartpole"),
    "dqn": DQN,
    "qrdqn": DQN,
    "rem": DQN,
    "ddpg": OFF_POLICY,
    "td3": OFF_POLICY,
    "sac": OFF_POLICY,
    "d4pg": OFF_POLICY,
    "bc": OFFLINE
    + named("algos/test_offline.py", "test_discrete_learners_pick_the_rewarded_action"),
    "cql": OFFLINE + named("algos/test_offline.py", "test_cql_learns_pendulum_medium"),
    "iql-offline": OFFLINE + named("algos/test_offline.py", "test_learns_pendulum_medium"),
    "td3-bc": OFFLINE + named("algos/test_offline.py", "test_learns_pendulum_medium"),
    "q-learning": TABULAR,
    "sarsa": TABULAR,
    "expected-sarsa": TABULAR,
    "sarsa-lambda": TABULAR,
    "q-lambda": TABULAR,
    "tabular": TABULAR,
    "qmix": QMIX,
    "vdn": QMIX,
    "iql": QMIX,
    "impala": named("distributed/test_impala.py", "test_smoke_in_process",
                    "test_resume_in_process_is_exact", "test_learns_cartpole_with_ray_runners"),
    "a3c": named("distributed/test_a3c.py", "test_ray_workers_smoke_restart_and_resume",
                 "test_in_process_resume_is_exact", "test_learns_cartpole_with_two_workers"),
    "ddppo": named("distributed/test_ddppo.py",
                   "test_ray_learners_stay_identical_and_a_lost_learner_stops_the_run",
                   "test_resume_is_exact", "test_learns_cartpole_with_two_learners"),
    "appo": named("algos/test_appo.py", "test_ray_runners_sample_ahead", "test_resume_is_exact",
                  "test_appo_solves_cartpole"),
    "r2d2": named("algos/test_r2d2.py", "test_smoke", "test_resume_is_exact")
    + named("algos/test_corrections_learning.py", "test_r2d2_remembers_where_dqn_cannot"),
    # Ape-X and distributed MADDPG: one test trains, checkpoints and resumes (not exactly).
    "apex-dqn": named(APEX, *["test_apex_dqn_smoke_checkpoint_and_resume"] * 2,
                      "test_apex_dqn_learns_cartpole"),
    "apex-ddpg": named(APEX, *["test_apex_ddpg_smoke_checkpoint_and_resume"] * 2,
                       "test_apex_ddpg_swings_pendulum_up"),
    "apex-r2d2": named(APEX_R2D2, *["test_apex_r2d2_smoke_checkpoint_policy_and_resume"] * 2,
                       "test_apex_r2d2_remembers_the_first_cue"),
    "maddpg-distributed": named("distributed/test_distributed_maddpg.py",
                                *["test_smoke_checkpoint_and_resume"] * 2,
                                "test_beats_random_on_spread"),
    "es": EVOLUTION + named("algos/test_evolution.py", "test_es_solves_inverted_pendulum"),
    "ars": EVOLUTION + named("algos/test_evolution.py", "test_ars_solves_cartpole"),
    "ga": EVOLUTION + named("algos/test_evolution.py", "test_ga_solves_cartpole"),
    "cmaes": EVOLUTION + named("algos/test_evolution.py", "test_cmaes_learns_pendulum"),
    "alphazero": named("algos/test_alphazero.py", "test_smoke_trains_and_deploys_the_network",
                       "test_resume_is_exact", "test_learns_to_draw_against_perfect_play"),
    "muzero": named("algos/test_muzero.py", "test_smoke_trains_evaluates_and_deploys_the_search",
                    "test_resume_is_exact", "test_learns_cartpole_with_its_own_model"),
    # Planning with the true model learns nothing: its check is that the search balances
    # CartPole where random play falls (and it runs, so it is also the smoke test).
    "mcts": named("algos/test_planner.py",
                  "test_planning_balances_cartpole_where_random_play_falls",
                  "test_resume_is_exact",
                  "test_planning_balances_cartpole_where_random_play_falls"),
}  # fmt: skip


def test_every_registered_algorithm_has_an_entry():
    missing = sorted(set(ALGORITHMS) - set(COVERAGE))
    assert not missing, f"add their smoke, resume and learning tests to COVERAGE: {missing}"
    assert not set(COVERAGE) - set(ALGORITHMS), "COVERAGE names algorithms no longer registered"


@pytest.mark.parametrize("algo", sorted(COVERAGE))
def test_the_named_tests_exist(algo):
    assert len(COVERAGE[algo]) == 3  # smoke, resume, learning
    for node in COVERAGE[algo]:
        path, name = node.split("::")
        source = (TESTS / path).read_text()
        assert re.search(rf"^def {name}\(", source, re.MULTILINE), f"{algo}: {node} is gone"
