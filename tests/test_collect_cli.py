"""``shoal collect`` and ``shoal train ... --dataset`` from the command line, and the dataset
recipes behind ``shoal collect --recipe``."""

import numpy as np
import pytest

import shoal
from shoal.cli import main
from shoal.core.errors import ShoalError
from shoal.data.offline import read_dataset
from shoal.studies import datasets
from shoal.studies.datasets import Recipe, Source

pytestmark = pytest.mark.extra("offline")


def test_collect_a_random_dataset_then_train_on_it(tmp_path, capsys):
    out = tmp_path / "random"
    code = main(["collect", "--env", "CartPole-v1", "--out", str(out), "--episodes", "4",
                 "--num-envs", "2"])  # fmt: skip
    assert code == 0
    assert "4 episodes" in capsys.readouterr().out
    data = read_dataset(out)
    assert data.env_id == "CartPole-v1" and data.ref_min_score is None
    code = main(["train", "bc", "--dataset", str(out), "--total-steps", "20",
                 "--run-dir", str(tmp_path / "run"), "--run.eval-episodes", "2",
                 "--run.eval-every-steps", "20", "--replay.batch-size", "32"])  # fmt: skip
    assert code == 0
    assert "the dataset" in capsys.readouterr().out
    assert main(["collect", "--env", "CartPole-v1", "--out", str(out)]) == 2  # exists
    assert "exists" in capsys.readouterr().out


def test_collect_refuses_bad_options(tmp_path, capsys):
    assert main(["collect", "--out", str(tmp_path / "x")]) == 2
    assert "name a run" in capsys.readouterr().out
    assert main(["collect", "--env", "CartPole-v1", "--out", str(tmp_path / "x"),
                 "--epsilon", "2"]) == 2  # fmt: skip
    assert "--epsilon" in capsys.readouterr().out
    assert main(["collect", "--recipe", "nope"]) == 2
    assert "unknown dataset recipe" in capsys.readouterr().out
    assert main(["train", "iql", "--dataset", str(tmp_path)]) == 2
    assert "iql-offline" in capsys.readouterr().out


def test_noise_on_discrete_actions_and_shaping_without_a_policy_are_refused(tmp_path, capsys):
    """--noise used to be ignored on discrete actions while the dataset recorded "noise 0.3";
    --noise, --epsilon and --stochastic were ignored for a random policy."""
    run = shoal.train("ppo", env="CartPole-v1", total_steps=64, quiet=True,
                      run_dir=str(tmp_path / "run"),
                      **{"env.num_envs": 2, "num_steps": 32, "minibatch_size": 64,
                         "run.eval_every_steps": 0})  # fmt: skip
    out = tmp_path / "noisy"
    assert main(["collect", str(run.run_dir), "--out", str(out), "--noise", "0.3"]) == 2
    said = capsys.readouterr().out
    assert "--noise adds Gaussian noise to continuous (Box) actions" in said
    assert "--epsilon" in said and not out.exists()
    for option in (["--noise", "0.1"], ["--epsilon", "0.1"], ["--stochastic"]):
        assert main(["collect", "--env", "Pendulum-v1", "--out", str(out), *option]) == 2
        assert "a uniformly random policy has no such policy" in capsys.readouterr().out
    assert main(["collect", str(run.run_dir), "--out", str(out), "--epsilon", "0.2",
                 "--episodes", "2", "--num-envs", "2"]) == 0  # fmt: skip
    assert "epsilon 0.2" in read_dataset(out).metadata["collector"]


def test_a_mappo_run_is_collected_as_what_its_actors_see(tmp_path, capsys):
    """MAPPO's rows carry the critic's global state after each agent's own observation: the
    dataset keeps the actor's part (what the deployed policy reads) and names the env without
    the global state, so an offline learner trains and evaluates on the agents' own view."""
    run = shoal.train("mappo", env="shoal/spread-v0", total_steps=64, quiet=True,
                      run_dir=str(tmp_path / "run"),
                      **{"env.num_envs": 2, "num_steps": 32, "minibatch_size": 64,
                         "run.eval_every_steps": 0})  # fmt: skip
    rows = shoal.load(run.run_dir).observation_space
    assert rows["actor"].shape == (17,) and rows["critic"].shape[0] > 0  # spread: 3 agents
    out = tmp_path / "x"
    assert main(["collect", str(run.run_dir), "--out", str(out), "--episodes", "3",
                 "--num-envs", "1"]) == 0  # fmt: skip
    data = read_dataset(out)
    assert data.observation_space.shape == (17,)
    assert data.env == {"id": "shoal/spread-v0", "agent_id": True}  # no global_state
    assert all(e.observations.shape[1:] == (17,) for e in data.episodes)
    assert data.ref_max_score is not None  # the run's own policy, on whole rows
    # What the actor saw: the same env without the global state gives the same first rows.
    own_view = shoal.make_env("shoal/spread-v0", num_envs=1, agent_id=True)
    first = own_view.reset(seed=0)  # collect's seed; agent 0's episode ends first (row order)
    np.testing.assert_array_equal(data.episodes[0].observations[0], first[0])
    own_view.close()
    ippo = shoal.train("ippo", env="shoal/spread-v0", total_steps=64, quiet=True,
                       run_dir=str(tmp_path / "ippo"),
                       **{"env.num_envs": 2, "num_steps": 32, "minibatch_size": 64,
                          "run.eval_every_steps": 0})  # fmt: skip
    with pytest.raises(ShoalError, match="the expert .* reads observations"):
        shoal.collect(tmp_path / "y", run.run_dir, episodes=3, num_envs=1, expert=ippo.run_dir)
    bc = shoal.train("bc", dataset=str(out), total_steps=10, quiet=True,
                     run_dir=str(tmp_path / "bc"),
                     **{"run.eval_every_steps": 10, "run.eval_episodes": 2,
                        "replay.batch_size": 32})  # fmt: skip
    assert bc.eval_return is not None


@pytest.mark.extra("pettingzoo")
def test_a_run_of_several_agent_groups_is_refused(tmp_path, capsys):
    """simple_adversary's adversary and agents are two groups with their own policies."""
    run = shoal.train("ippo", env="pettingzoo:mpe2.simple_adversary_v3", total_steps=64,
                      quiet=True, run_dir=str(tmp_path / "run"),
                      **{"env.num_envs": 2, "num_steps": 32, "minibatch_size": 64,
                         "run.eval_every_steps": 0})  # fmt: skip
    assert main(["collect", str(run.run_dir), "--out", str(tmp_path / "x")]) == 2
    assert "has several agent groups, each with its own policy" in capsys.readouterr().out
    assert not (tmp_path / "x").exists()


def test_a_recipe_trains_its_source_once_and_collects_at_its_step(tmp_path, monkeypatch):
    source = Source("tiny-sac", "sac-pendulum",
                    {"seed": 0, "run.total_steps": 400, "run.target_return": None,
                     "replay.save": True, "run.checkpoint_every_steps": 200,
                     "run.keep_checkpoints": 5, "run.eval_every_steps": 0}, "seconds")  # fmt: skip
    recipes = {"tiny": Recipe("tiny", source, 200, episodes=3, noise=0.2),
               "tiny-replay": Recipe("tiny-replay", source, 200, from_replay=True,
                                     expert_score=-100.0)}  # fmt: skip
    monkeypatch.setattr(datasets, "RECIPES", recipes)
    calls = []
    train = datasets.train
    monkeypatch.setattr(datasets, "train", lambda *a, **k: calls.append(k) or train(*a, **k))
    runs = tmp_path / "runs"
    medium = datasets.make_dataset("tiny", tmp_path / "tiny", runs)
    replay = datasets.make_dataset("tiny-replay", tmp_path / "tiny-replay", runs)
    assert len(calls) == 1  # the source run is shared
    got = read_dataset(medium)
    assert len(got.episodes) == 3 and got.metadata["collector"].startswith(str(runs))
    assert got.ref_max_score is not None and got.ref_max_score != -100.0  # the final policy
    exported = read_dataset(replay)
    assert exported.ref_max_score == -100.0  # stated
    assert exported.num_steps == 199  # 200 stored steps, the last one's next obs unknown


def test_a_team_run_is_collected_as_each_agent_s_episodes(tmp_path):
    """A shared-weight group (IPPO) acts as rows of agents: each agent's trajectory is an
    episode, and the dataset records the env settings its observations need (agent ids)."""
    run = shoal.train("ippo", env="shoal/spread-v0", total_steps=512, quiet=True,
                      run_dir=str(tmp_path / "ippo"),
                      **{"run.eval_every_steps": 0, "env.num_envs": 4})  # fmt: skip
    out = shoal.collect(tmp_path / "team", run.run_dir, episodes=6, num_envs=2)
    data = read_dataset(out)
    assert data.env == {"id": "shoal/spread-v0", "agent_id": True}
    assert len(data.episodes) == 6 and data.observation_space.shape == (17,)
    bc = shoal.train("bc", dataset=str(out), total_steps=20, quiet=True,
                     run_dir=str(tmp_path / "bc"),
                     **{"run.eval_every_steps": 20, "run.eval_episodes": 2,
                        "replay.batch_size": 32})  # fmt: skip
    assert bc.eval_return is not None


def test_collect_counts_down_its_episodes_and_reference_episodes(tmp_path, monkeypatch):
    """Long ``shoal collect`` runs show a bar with the time left for each stage: the data's
    episodes, then the random policy's (and the expert's) reference episodes."""
    import importlib

    made = []

    class Recorded:
        def __init__(self, total, label):
            self.total, self.label, self.counts = total, label, []
            made.append(self)

        def __enter__(self):
            return self.counts.append

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(importlib.import_module("shoal.train.progress"), "Countdown", Recorded)
    assert main(["collect", "--env", "CartPole-v1", "--out", str(tmp_path / "d"), "--episodes",
                 "5", "--ref-episodes", "3", "--num-envs", "2"]) == 0  # fmt: skip
    stages = [(c.label, c.total, c.counts[-1]) for c in made]
    assert stages == [("episodes", 5, 5), ("random policy's reference episodes", 3, 3)]
