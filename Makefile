# Set-up is implicit: every target that needs the virtual environment creates it first.
#   make train   trains PPO on CartPole-v1 (the embedded default) and prints the run directory
#                (TRAIN_ARGS="--seed 3 --run-dir DIR" passes options on)
#   make test    runs the linters and the tests except the learning checks
#   make test-learning  runs the fixed-seed learning checks (CI runs it after make test)
#   make test-slow  runs the slow learning checks (minutes each; not part of CI)
#   make test-fuzz  runs the fuzz tests on new random examples (make test's are fixed)
#   make test-floor runs the tests on the oldest PyTorch shoal supports (pyproject's floor)
#   make bench   runs the benchmarks against Stable-Baselines3

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CORE_STAMP := $(VENV)/.shoal-core-installed
STAMP := $(VENV)/.shoal-installed
BENCH_STAMP := $(VENV)/.shoal-bench-installed

.PHONY: install train test test-learning test-learning-seeds test-slow test-fuzz test-floor test-floors lint docs bench bench-scaling bench-marl bench-intersection bench-tune bench-peers bench-offline clean

install: $(STAMP)

# constraints.txt pins torch to the CPU build this project is developed against. `make train`
# needs shoal's own dependencies only (seconds to install beside torch); the tests need every
# extra (Ray, SUMO, SMARTS, MuJoCo, Atari, ...: several GB), installed on top.
$(CORE_STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e .
	touch $(CORE_STAMP)

$(STAMP): $(CORE_STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,video,mujoco,pettingzoo,atari,ray,sumo,smarts,export,report,tune,wandb,mlflow,cma,openspiel,box2d,offline,docs]'
	touch $(STAMP)

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,video,mujoco,pettingzoo,atari,ray,sumo,smarts,export,report,tune,wandb,mlflow,cma,openspiel,box2d,offline,docs,bench]'
	touch $(BENCH_STAMP)

train: $(CORE_STAMP)
	$(BIN)/shoal train --tuned ppo-cartpole $(TRAIN_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check shoal tests benchmarks docs
	$(BIN)/ruff format --check shoal tests benchmarks docs
	$(BIN)/mypy   # pyproject.toml's [tool.mypy]: all of shoal; strict on configs, types, interfaces, losses, API

# The documentation site, into site/ (warnings are errors: a broken link, an unknown name, a
# config field without a docstring); the tests build it too and run its examples.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# One pytest worker per core (pytest-xdist); the tests that share the local Ray run in one.
# shoal's bytecode is compiled first: the tests start many processes (Ray actors, the CLI),
# and where PYTHONDONTWRITEBYTECODE is set each would compile shoal again (0.5 s each).
# Unit, smoke, resume, fault and interface tests: everything but the learning checks (the
# `learning` and `slow` markers), one worker per core.
test: lint
	$(BIN)/python -m compileall -q shoal
	$(BIN)/python -m pytest -q -n auto --dist loadgroup --durations=10 -m "not learning and not slow"

# The fixed-seed learning checks: each algorithm (and the references' tasks) learns past what
# a random policy reaches. Kept out of make test for its time; CI (.ci/run) runs both.
test-learning: $(STAMP)
	$(BIN)/python -m compileall -q shoal
	$(BIN)/python -m pytest -q -n auto --dist loadgroup --durations=10 -m "learning and not slow"

# The learning checks again with every fresh run's seed shifted by 1, 2, 3 and 4 (tests/
# conftest.py, --seed-offset): whether each threshold holds across seeds, not only on its own.
# About 4 x make test-learning; not part of CI. benchmarks/README.md has the last results.
test-learning-seeds: $(STAMP)
	for offset in 1 2 3 4; do \
		$(BIN)/python -m pytest -q -n auto --dist loadgroup -m "learning and not slow" \
			--seed-offset $$offset -rf 2>&1 | grep -E "^FAILED|passed|failed" \
			| sed "s/^/seed offset $$offset: /"; \
	done

# Long learning checks, not part of CI: PPO on Atari Pong and Breakout (float32, and bfloat16
# where the CPU has it: 15-28 minutes each on 2 cores), and learning checks of 1-3 minutes
# beside the other tests (MuZero on CartPole, distributed MADDPG, MADDPG with PER).
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow --durations=10

# The fuzz tests on examples drawn afresh, 600 a test (make test runs a fixed 60 a test).
test-fuzz: $(STAMP)
	SHOAL_FUZZ=explore $(BIN)/python -m pytest -q tests/test_fuzz.py

# The oldest PyTorch pyproject.toml admits, in an environment of its own (a CUDA wheel from
# PyPI: several GB); everything else as `make install` has it.
TORCH_FLOOR ?= 2.7.1
FLOOR_VENV ?= .venv-floor
$(FLOOR_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(FLOOR_VENV)
	echo 'torch==$(TORCH_FLOOR)' > $(FLOOR_VENV)/constraints.txt
	$(FLOOR_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -c $(FLOOR_VENV)/constraints.txt -e '.[dev,video,mujoco,pettingzoo,atari,ray,sumo,smarts,export,report,tune,wandb,mlflow,cma,openspiel,box2d,offline]'
	touch $(FLOOR_VENV)/.installed

test-floor: $(FLOOR_VENV)/.installed
	$(FLOOR_VENV)/bin/python -m pytest -q -n auto --dist loadgroup --durations=10

# Every core dependency at the floor pyproject.toml states (torch at TORCH_FLOOR; numpy,
# Gymnasium, tyro, ... at their >= versions) with the test tools only, in an environment of
# its own: the tests that need an extra skip, naming it; the rest (every core algorithm's
# smoke, resume and learning tests) run on the oldest versions shoal says it supports.
FLOORS_VENV ?= .venv-floors
$(FLOORS_VENV)/.installed: pyproject.toml tests/floor_constraints.py
	$(PYTHON) -m venv $(FLOORS_VENV)
	$(PYTHON) tests/floor_constraints.py --torch $(TORCH_FLOOR) > $(FLOORS_VENV)/constraints.txt
	$(FLOORS_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -c $(FLOORS_VENV)/constraints.txt 'setuptools>=68' -e '.[dev]'
	touch $(FLOORS_VENV)/.installed

test-floors: $(FLOORS_VENV)/.installed
	$(FLOORS_VENV)/bin/python -m pytest -q -n auto --dist loadgroup --durations=10

bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/ppo_cartpole.py --seeds 3

# RLlib pins an older Gymnasium, so it gets its own virtual environment (created once).
RLLIB_VENV ?= .venv-rllib
$(RLLIB_VENV)/.installed:
	$(PYTHON) -m venv $(RLLIB_VENV)
	$(RLLIB_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt 'ray[rllib]==2.60.0' torch
	touch $(RLLIB_VENV)/.installed

bench-scaling: $(BENCH_STAMP) $(RLLIB_VENV)/.installed
	$(BIN)/python benchmarks/scaling.py --rllib-python $(RLLIB_VENV)/bin/python

# BenchMARL pins its own TorchRL and TensorDict, so it gets its own virtual environment too; the
# mpe2 tasks both libraries train come from the same PettingZoo and mpe2 versions as shoal's.
BENCHMARL_VENV ?= .venv-benchmarl
$(BENCHMARL_VENV)/.installed:
	$(PYTHON) -m venv $(BENCHMARL_VENV)
	$(BENCHMARL_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt 'benchmarl==1.5.2' 'pettingzoo==1.27.0' 'mpe2==1.1.1' 'gymnasium==1.4.0' torch
	touch $(BENCHMARL_VENV)/.installed

bench-marl: $(BENCH_STAMP) $(BENCHMARL_VENV)/.installed
	$(BIN)/python benchmarks/marl.py --seeds 3 --benchmarl-python $(BENCHMARL_VENV)/bin/python

# highway-env needs pygame-ce, which replaces the pygame shoal's video extra installs, so its
# intersection (a speed row of benchmarks/intersection.py) gets its own environment.
HIGHWAY_VENV ?= .venv-highway
$(HIGHWAY_VENV)/.installed:
	$(PYTHON) -m venv $(HIGHWAY_VENV)
	$(HIGHWAY_VENV)/bin/python -m pip install --quiet --disable-pip-version-check 'highway-env==1.12.1' 'gymnasium==1.4.0'
	touch $(HIGHWAY_VENV)/.installed

bench-intersection: $(BENCH_STAMP) $(HIGHWAY_VENV)/.installed
	$(BIN)/python benchmarks/intersection.py --speed --validate --highway-python $(HIGHWAY_VENV)/bin/python

# rl-baselines3-zoo (and its Stable-Baselines3 and sb3-contrib) for shoal tune's comparison
# with the zoo's --optimize; pandas for the zoo's own report of a search.
ZOO_VENV ?= .venv-zoo
$(ZOO_VENV)/.installed:
	$(PYTHON) -m venv $(ZOO_VENV)
	$(ZOO_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt 'rl-zoo3==2.9.2' 'gymnasium==1.4.0' pandas torch
	touch $(ZOO_VENV)/.installed

bench-tune: $(STAMP) $(ZOO_VENV)/.installed
	$(BIN)/python benchmarks/tune_cartpole.py --seeds 3 --zoo-python $(ZOO_VENV)/bin/python --json benchmarks/results/tune_cartpole.json

# EvoTorch for benchmarks/evolution.py's comparison (its own pins of Ray and Gymnasium).
EVOTORCH_VENV ?= .venv-evotorch
$(EVOTORCH_VENV)/.installed:
	$(PYTHON) -m venv $(EVOTORCH_VENV)
	$(EVOTORCH_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt 'evotorch==0.6.1' 'gymnasium[mujoco]==1.4.0' torch
	touch $(EVOTORCH_VENV)/.installed

bench-evolution: $(BENCH_STAMP) $(EVOTORCH_VENV)/.installed
	$(BIN)/python benchmarks/evolution.py --seeds 3 --evotorch-python $(EVOTORCH_VENV)/bin/python

# DeepMind's mctx (JAX, on the CPU) for benchmarks/search.py's comparison.
MCTX_VENV ?= .venv-mctx
$(MCTX_VENV)/.installed:
	$(PYTHON) -m venv $(MCTX_VENV)
	$(MCTX_VENV)/bin/python -m pip install --quiet --disable-pip-version-check 'mctx==0.0.71' 'jax==0.10.2'
	touch $(MCTX_VENV)/.installed

bench-search: $(STAMP) $(MCTX_VENV)/.installed
	$(BIN)/python benchmarks/search.py --mctx-python $(MCTX_VENV)/bin/python

# LightZero (its own pins: gymnasium 0.28, NumPy < 2, DI-engine's torch) for benchmarks/muzero.py.
LIGHTZERO_VENV ?= .venv-lightzero
$(LIGHTZERO_VENV)/.installed:
	$(PYTHON) -m venv $(LIGHTZERO_VENV)
	$(LIGHTZERO_VENV)/bin/python -m pip install --quiet --disable-pip-version-check 'lightzero==0.2.0'
	touch $(LIGHTZERO_VENV)/.installed

# d3rlpy (its own pins: gymnasium 1.0) for benchmarks/offline.py.
D3RLPY_VENV ?= .venv-d3rlpy
$(D3RLPY_VENV)/.installed:
	$(PYTHON) -m venv $(D3RLPY_VENV)
	$(D3RLPY_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt 'd3rlpy==2.8.1' 'minari[hdf5]==0.5.4' pillow
	touch $(D3RLPY_VENV)/.installed

bench-offline: $(STAMP) $(D3RLPY_VENV)/.installed
	$(BIN)/shoal collect --recipe pendulum-medium --out datasets/pendulum-medium || test -d datasets/pendulum-medium
	$(BIN)/python benchmarks/offline.py --seeds 3 --d3rlpy-python $(D3RLPY_VENV)/bin/python --json benchmarks/results/offline.json

bench-muzero: $(STAMP) $(LIGHTZERO_VENV)/.installed
	$(BIN)/python benchmarks/muzero.py --seeds 2 --lightzero-python $(LIGHTZERO_VENV)/bin/python --json benchmarks/results/muzero.json

# The peers of benchmarks/peers.py, each in its own environment where its pins conflict with
# shoal's: TorchRL (its TensorDict), Tianshou (its Atari wrappers need NumPy < 2.3), Sample
# Factory (Gymnasium 0.29, with ale-py 0.9 for the ROMs). SB3 runs in shoal's bench extra.
TORCHRL_VENV ?= .venv-torchrl
$(TORCHRL_VENV)/.installed:
	$(PYTHON) -m venv $(TORCHRL_VENV)
	$(TORCHRL_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt 'torchrl==0.14.1' 'gymnasium[mujoco,atari]==1.4.0' opencv-python-headless torch
	touch $(TORCHRL_VENV)/.installed

TIANSHOU_VENV ?= .venv-tianshou
$(TIANSHOU_VENV)/.installed:
	$(PYTHON) -m venv $(TIANSHOU_VENV)
	$(TIANSHOU_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt 'tianshou==2.0.1' 'gymnasium[mujoco,atari]==1.4.0' 'numpy<2.3' opencv-python-headless torch
	touch $(TIANSHOU_VENV)/.installed

SF_VENV ?= .venv-sf
$(SF_VENV)/.installed:
	$(PYTHON) -m venv $(SF_VENV)
	$(SF_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt 'sample-factory==2.1.1' torch
	$(SF_VENV)/bin/python -m pip install --quiet --disable-pip-version-check 'ale-py==0.9.1'
	touch $(SF_VENV)/.installed

bench-peers: $(BENCH_STAMP) $(TORCHRL_VENV)/.installed $(TIANSHOU_VENV)/.installed $(SF_VENV)/.installed
	$(BIN)/python benchmarks/peers.py --seeds 3 --json benchmarks/results/peers.json

clean:
	rm -rf $(VENV) $(FLOOR_VENV) $(FLOORS_VENV) $(RLLIB_VENV) $(BENCHMARL_VENV) $(HIGHWAY_VENV) $(ZOO_VENV) $(TORCHRL_VENV) $(TIANSHOU_VENV) $(SF_VENV) runs .pytest_cache .ruff_cache
