"""An AlphaZero run's search against minimax players of several depths, beside the same search
with the untrained network: how much the training added.

Usage: ``python benchmarks/alphazero_minimax.py RUN_OR_CHECKPOINT [--depths 2,4,6]
[--games 20] [--simulations 64]`` (a run of ``shoal train --tuned alphazero-connect4``).
Prints one JSON line per (depth, network). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch

from shoal.algos.planning.alphazero import AlphaZero, AlphaZeroConfig
from shoal.config import from_dict
from shoal.search.arena import SearchPlayer, match
from shoal.search.minimax import MinimaxPlayer
from shoal.train.checkpoint import load_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run")
    parser.add_argument("--depths", default="2,4,6")
    parser.add_argument("--games", type=int, default=20)
    parser.add_argument("--simulations", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    checkpoint = load_checkpoint(args.run)
    config = from_dict(AlphaZeroConfig, checkpoint.config)
    trained, untrained = AlphaZero(config), AlphaZero(config)
    trained.load_state_dict(checkpoint.algorithm_state)
    search_config = dataclasses.replace(config.search, num_simulations=args.simulations)
    for depth in (int(d) for d in args.depths.split(",")):
        for name, algo in (("untrained", untrained), ("trained", trained)):
            started = time.perf_counter()
            player = SearchPlayer(algo.game, algo._evaluator(algo.net), search_config, seed=1)
            result = match(algo.game, player, MinimaxPlayer(algo.game, depth, seed=2),
                           args.games, seed=3)  # fmt: skip
            print(json.dumps({"depth": depth, "network": name, "wins": result.wins,
                              "draws": result.draws, "losses": result.losses,
                              "score": result.score,
                              "seconds": round(time.perf_counter() - started, 1)}))  # fmt: skip


if __name__ == "__main__":
    main()
