"""Batched MCTS simulations per second: shoal against DeepMind's mctx (JAX) on the CPU.

Both search a learned model of the same shape and cost: latent states of 32 numbers, 8
actions, a dynamics MLP (latent + one-hot action -> 64 -> latent) and a prediction MLP
(latent -> 64 -> 8 logits, value, reward), fixed random weights; MuZero's PUCT, 64
simulations a search, no root noise. Batches of 1, 16 and 256 trees; one CPU thread for both
(``XLA_FLAGS`` single-threaded Eigen on mctx's side, ``torch.set_num_threads(1)`` on
shoal's). mctx's search is compiled by ``jax.jit`` before timing (the compile is reported
apart); shoal's runs eagerly.

Usage: ``python benchmarks/search.py [--mctx-python .venv-mctx/bin/python] [--repeats 3]``
(``make .venv-mctx/.installed`` makes mctx's environment). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch

from shoal.search import Expansion, MCTSConfig, search

HERE = Path(__file__).parent
LATENT, ACTIONS, HIDDEN, SIMULATIONS = 32, 8, 64, 64
BATCHES = (1, 16, 256)


class LatentModel:
    """MuZero's shape of model with fixed random weights."""

    num_actions, state_shape = ACTIONS, (LATENT,)

    def __init__(self, seed: int = 0):
        torch.manual_seed(seed)
        self.dynamics = torch.nn.Sequential(
            torch.nn.Linear(LATENT + ACTIONS, HIDDEN), torch.nn.ReLU(),
            torch.nn.Linear(HIDDEN, LATENT), torch.nn.Tanh(),
        )  # fmt: skip
        self.prediction = torch.nn.Sequential(
            torch.nn.Linear(LATENT, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, ACTIONS + 2)
        )

    @torch.no_grad()
    def _predict(self, latent: torch.Tensor) -> tuple:
        out = self.prediction(latent)
        legal = torch.ones(len(latent), ACTIONS, dtype=torch.bool)
        return out[:, :ACTIONS], legal, out[:, ACTIONS], out[:, ACTIONS + 1]

    def root(self, latent: torch.Tensor) -> Expansion:
        logits, legal, value, _ = self._predict(latent)
        return Expansion(latent, logits, legal, value)

    @torch.no_grad()
    def step(self, latent: torch.Tensor, actions: torch.Tensor) -> Expansion:
        hot = torch.nn.functional.one_hot(actions, ACTIONS).float()
        nxt = self.dynamics(torch.cat([latent, hot], -1))
        logits, legal, value, reward = self._predict(nxt)
        discount = torch.full((len(nxt),), 0.997)
        return Expansion(nxt, logits, legal, value, reward, discount)


def shoal_rate(batch: int, repeats: int, compile: bool) -> float:
    torch.set_num_threads(1)
    model = LatentModel()
    config = MCTSConfig(num_simulations=SIMULATIONS, dirichlet_fraction=0.0, compile=compile)
    roots = torch.randn(batch, LATENT, generator=torch.Generator().manual_seed(batch))
    search(model, roots, config)  # warm-up
    rates = []
    for _ in range(repeats):
        tick = time.perf_counter()
        search(model, roots, config)
        rates.append(batch * SIMULATIONS / (time.perf_counter() - tick))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mctx-python", default=str(HERE.parent / ".venv-mctx/bin/python"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    report: dict = {"settings": {"latent": LATENT, "actions": ACTIONS, "hidden": HIDDEN,
                                 "simulations": SIMULATIONS}, "rows": {}}  # fmt: skip
    for batch in BATCHES:
        row = {"shoal": shoal_rate(batch, args.repeats, False),
               "shoal compiled": shoal_rate(batch, args.repeats, True)}  # fmt: skip
        if Path(args.mctx_python).exists():
            command = [args.mctx_python, str(HERE / "mctx_side.py"), "--batch", str(batch),
                       "--repeats", str(args.repeats)]  # fmt: skip
            env = {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}
            import os

            out = subprocess.run(command, capture_output=True, text=True, check=True,
                                 env={**os.environ, **env}).stdout  # fmt: skip
            side = json.loads(out.strip().splitlines()[-1])
            row["mctx"], row["mctx_compile_s"] = side["rate"], side["compile_s"]
            row["shoal_over_mctx"] = row["shoal"] / row["mctx"]
            row["compiled_over_mctx"] = row["shoal compiled"] / row["mctx"]
        report["rows"][batch] = row
        print(f"batch {batch:>3}: " + ", ".join(f"{k} {v:,.1f}" for k, v in row.items()),
              flush=True)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
