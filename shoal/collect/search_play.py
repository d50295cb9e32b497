"""Self-play by search, in the learner's process or as Ray actors: AlphaZero's games against
itself with MCTS on the game's rules (`SearchSelfPlay`), and MuZero's episodes of a vector env
with MCTS in the learned model (`LatentSelfPlay`).

`SearchSelfPlay` holds ``num_games`` games in progress, searched as one batch of trees (the subtree
under each move kept for the next search). `play` advances every game ``moves`` moves with
the weights it was last given and returns the positions of the games that ended: each
position as the player to move saw it, its legal moves, the root's visit distribution (or
the improved policy of a Gumbel search) and that player's final outcome. A finished game's
slot starts a new game at once. Everything it draws comes from its own seeded generators, so
one actor's games are the same whether it runs alone or beside others.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch

from shoal.config import EnvConfig
from shoal.core.errors import ConfigError
from shoal.core.seeding import derive_seed
from shoal.data.positions import Positions
from shoal.distributed.in_process import InProcessPool
from shoal.envs.games import GameVectorEnv, is_game_id, make_game
from shoal.envs.make import make_env
from shoal.envs.snapshot import EnvStateUnsupported
from shoal.search import MCTSConfig, search, subtree, visit_policy
from shoal.search.arena import choose
from shoal.search.gumbel import gumbel_action, improved_policy
from shoal.search.models import GameModel, LatentModel, decode
from shoal.search.tree import Tree, clear, restore_tree, tree_arrays


class SelfPlayResult(NamedTuple):
    positions: Positions | None
    """The finished games' positions (numpy arrays), None when no game ended."""
    first_player_returns: list[float]
    """Each finished game's outcome for its first player."""
    moves: int
    """Moves played (one per game per step)."""


class SearchSelfPlay:
    """``num_games`` self-play games of ``env_id`` with a network from ``model_fn()``."""

    def __init__(self, env_id: str, model_fn: Callable[[], torch.nn.Module],
                 search_config: MCTSConfig, num_games: int, temperature_moves: int,
                 reuse_tree: bool, seed: int, device: str = "cpu"):  # fmt: skip
        self.game = make_game(env_id)
        self.net = model_fn().to(device).eval()
        self.device = device
        self.search_config, self.temperature_moves = search_config, temperature_moves
        self.reuse_tree, self.seed = reuse_tree, seed
        self.rng = np.random.default_rng(derive_seed(seed, "moves"))
        self.noise = torch.Generator().manual_seed(derive_seed(seed, "root-noise"))
        self.games_started = 0
        self.seeds: list[int] = []
        """The seed of each slot's game (PettingZoo games replay from it on a resume)."""
        self.states = [self._new_game(b) for b in range(num_games)]
        self.moves = [0] * num_games
        self.histories: list[list[tuple]] = [[] for _ in range(num_games)]
        self.tree: Tree | None = None

    def _new_game(self, slot: int) -> Any:
        self.games_started += 1
        seed = derive_seed(self.seed, "game", self.games_started)
        if slot == len(self.seeds):
            self.seeds.append(seed)
        self.seeds[slot] = seed
        return self.game.initial(seed)

    def set_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.net.load_state_dict(weights)

    def play(self, moves: int) -> SelfPlayResult:
        finished: list[tuple[list, tuple[float, float]]] = []
        for _ in range(moves):
            finished += self._move()
        if not finished:
            return SelfPlayResult(None, [], moves * len(self.states))
        rows = [_positions(history, returns) for history, returns in finished]
        positions = Positions(*(np.concatenate(column) for column in zip(*rows, strict=True)))
        return SelfPlayResult(positions, [r[0] for _, r in finished], moves * len(self.states))

    def _move(self) -> list[tuple[list, tuple[float, float]]]:
        """One move in every game; the histories and outcomes of the games that ended."""
        cfg, game = self.search_config, self.game
        net = self.net
        model = GameModel(game, lambda obs: net(obs), self.device)
        tree = search(model, self.states, cfg, self.noise, tree=self.tree)
        if cfg.gumbel:  # Gumbel MuZero's move and policy target (its own exploration)
            targets = improved_policy(tree, cfg)
            actions = gumbel_action(tree, cfg).numpy()
        else:
            targets = visit_policy(tree, 1.0)
            sample = torch.tensor([m < self.temperature_moves for m in self.moves])
            actions = choose(targets, sample, self.rng)
        finished, ended = [], []
        for b, state in enumerate(self.states):
            self.histories[b].append((game.observation(state), game.legal(state),
                                      targets[b].numpy(), game.to_move(state)))  # fmt: skip
            self.states[b], _, done = game.play(state, int(actions[b]))
            self.moves[b] += 1
            if done:
                finished.append((self.histories[b], game.returns(self.states[b])))
                ended.append(b)
                self.histories[b], self.moves[b] = [], 0
                self.states[b] = self._new_game(b)
        if self.reuse_tree:
            reused = subtree(tree, torch.as_tensor(actions))
            self.tree = clear(reused, torch.tensor(ended, dtype=torch.long))
        return finished

    def state_dict(self) -> dict[str, Any]:
        return {
            "rng": self.rng.bit_generator.state,
            "noise": self.noise.get_state(),
            "games": [self.game.history(s) for s in self.states],
            "games_started": self.games_started,
            "seeds": list(self.seeds),
            "moves": list(self.moves),
            "histories": [_pack_columns(h, _HISTORY_COLUMNS) for h in self.histories],
            "tree": None if self.tree is None else tree_arrays(self.tree),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.noise.set_state(state["noise"])
        self.games_started = int(state["games_started"])
        self.seeds = [int(seed) for seed in state["seeds"]]
        self.states = [self.game.replay(moves, seed) for moves, seed in
                       zip(state["games"], self.seeds, strict=True)]  # fmt: skip
        self.moves = [int(m) for m in state["moves"]]
        self.histories = [_unpack_columns(h, _HISTORY_COLUMNS) for h in state["histories"]]
        step = lambda s, a: self.game.play(s, a)[0]  # noqa: E731
        tree = state["tree"]
        self.tree = None if tree is None else restore_tree(tree, self.states, step)


def _positions(history: list, returns: tuple[float, float]) -> Positions:
    obs, legal, policy, players = zip(*history, strict=True)
    outcome = np.array([returns[p] for p in players], np.float32)
    return Positions(np.stack(obs), np.stack(legal), np.stack(policy).astype(np.float32), outcome)


_HISTORY_COLUMNS = ("obs", "legal", "policy", "players")


class FinishedEpisode(NamedTuple):
    """One episode of `LatentSelfPlay` (numpy arrays over its ``T`` steps)."""

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    root_values: np.ndarray
    policies: np.ndarray
    terminated: bool
    final_value: float
    """The network's value of the observation after the last step (bootstraps a truncated
    episode; 0 after a terminal step)."""


class LatentPlayResult(NamedTuple):
    episodes: list[FinishedEpisode]
    returns: list[float]
    """The undiscounted returns of the episodes that ended (the env's count)."""
    env_steps: int


class LatentSelfPlay:
    """MuZero's self-play: ``env_config.num_envs`` envs, each step one batched search in the
    network's hidden states, the move drawn from the root's visits at the step's temperature
    (or, with ``search_config.gumbel``, by sequential halving). ``seed`` seeds the envs, the
    moves and the root noise; ``model_fn(obs_space, action_space)`` builds the network."""

    def __init__(self, env_config: EnvConfig,
                 model_fn: Callable[[gym.Space, gym.Space], torch.nn.Module],
                 search_config: MCTSConfig, discount: float, seed: int,
                 device: str = "cpu"):  # fmt: skip
        if is_game_id(env_config.id):  # a two-player game as self-play (discount -1)
            self.env: Any = GameVectorEnv(make_game(env_config.id), env_config.num_envs)
        else:
            self.env = make_env(env_config, seed=derive_seed(seed, "env"))
        net = model_fn(self.env.observation_space, self.env.action_space).to(device).eval()
        self.net: Any = net  # a MuZero network (initial/recurrent inference)
        self.search_config, self.discount, self.device = search_config, discount, device
        self.rng = np.random.default_rng(derive_seed(seed, "moves"))
        self.noise = torch.Generator().manual_seed(derive_seed(seed, "root-noise"))
        self.obs = self.env.reset(seed=derive_seed(seed, "env"))
        self.open: list[list[tuple]] = [[] for _ in range(self.env.num_envs)]
        """Each env's episode so far: (obs, action, reward, root value, visit policy)."""

    def describe(self) -> dict[str, Any]:
        return {"observation_space": self.env.observation_space,
                "action_space": self.env.action_space,
                "agents_per_env": self.env.agents_per_env}  # fmt: skip

    def set_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.net.load_state_dict(weights)

    def play(self, temperatures: list[float]) -> LatentPlayResult:
        """One vector step per entry of ``temperatures`` (each step's visit temperature)."""
        episodes: list[FinishedEpisode] = []
        returns: list[float] = []
        for temperature in temperatures:
            returns += self._step(temperature, episodes)
        return LatentPlayResult(episodes, returns, len(temperatures) * self.env.num_envs)

    def _step(self, temperature: float, episodes: list[FinishedEpisode]) -> list[float]:
        cfg, env = self.search_config, self.env
        obs = torch.as_tensor(np.asarray(self.obs, np.float32))
        legal = getattr(env, "action_mask", None)
        if legal is not None:  # a finished game's row has no legal move: its action is ignored
            legal = torch.as_tensor(legal)
            legal[~legal.any(-1)] = True
        tree = search(LatentModel(self.net, self.discount, legal), obs, cfg, self.noise)
        if cfg.gumbel:  # Gumbel MuZero: its move and its improved-policy target
            targets = improved_policy(tree, cfg).cpu()
            actions = gumbel_action(tree, cfg).cpu().numpy()
        else:
            targets = visit_policy(tree, 1.0).cpu()
            sampled = visit_policy(tree, temperature).double().cpu().numpy()
            actions = np.array([self.rng.choice(len(p), p=p / p.sum()) for p in sampled])
        root_values = tree.node_value[:, 0].cpu().numpy()
        result = env.step(actions)
        for b in range(env.num_envs):
            if result.autoreset[b]:  # the reset step of next-step autoreset: not a move
                continue
            self.open[b].append((self.obs[b], actions[b], float(result.reward[b]),
                                 float(root_values[b]), targets[b].numpy()))  # fmt: skip
            if result.terminated[b] or result.truncated[b]:
                episodes.append(self._finish(b, bool(result.terminated[b]), result.obs[b]))
        self.obs = result.obs
        return [float(r) for r in result.episode_returns]

    def _finish(self, b: int, terminated: bool, final_obs: np.ndarray) -> FinishedEpisode:
        columns = zip(*self.open[b], strict=True)
        obs, actions, rewards, values, policies = (np.stack(column) for column in columns)
        self.open[b] = []
        final_value = 0.0
        if not terminated:  # truncated: the final observation's value bootstraps it
            with torch.inference_mode():
                final = torch.as_tensor(final_obs[None], dtype=torch.float32, device=self.device)
                final_value = float(decode(self.net.initial(final)[2])[0])
        return FinishedEpisode(obs.astype(np.float32), actions, rewards.astype(np.float32),
                               values.astype(np.float32), policies.astype(np.float32),
                               terminated, final_value)  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        try:
            env_state = self.env.get_state()
        except EnvStateUnsupported:
            env_state = None
        return {
            "rng": self.rng.bit_generator.state,
            "noise": self.noise.get_state(),
            "env": env_state,
            "obs": np.array(self.obs),
            "open": [_pack_columns(steps, _EPISODE_COLUMNS) for steps in self.open],
        }

    def load_state_dict(self, state: dict[str, Any], fallback_seed: int = 0) -> bool:
        """Restore mid-episode; False when the env could not be saved and its episodes
        restart (from ``fallback_seed``), the partial ones dropped."""
        self.rng.bit_generator.state = state["rng"]
        self.noise.set_state(state["noise"])
        if state["env"] is None:
            self.obs = self.env.reset(seed=fallback_seed)
            self.open = [[] for _ in range(self.env.num_envs)]
            return False
        self.env.set_state(state["env"])
        self.obs = np.asarray(state["obs"]).copy()
        self.open = [_unpack_columns(packed, _EPISODE_COLUMNS) for packed in state["open"]]
        return True

    def close(self) -> None:
        self.env.close()


_EPISODE_COLUMNS = ("obs", "actions", "rewards", "root_values", "policies")


def _pack_columns(rows: list[tuple], names: tuple[str, ...]) -> dict[str, Any]:
    if not rows:
        return {"length": 0}
    columns = [np.stack(column) for column in zip(*rows, strict=True)]
    return {"length": len(rows), **dict(zip(names, columns, strict=True))}


def _unpack_columns(packed: dict[str, Any], names: tuple[str, ...]) -> list[tuple]:
    if int(packed["length"]) == 0:
        return []
    columns = [np.asarray(packed[name]) for name in names]
    return list(zip(*columns, strict=True))


def self_play_pool(
    worker_cls: type,
    args: Callable[[int], tuple],
    run: Any,
    device: torch.device,
    on_restart: Callable[[int], None],
    local_args: tuple | None = None,
) -> Any:
    """The self-play workers of a learner: with ``run.runners`` 0 one ``worker_cls`` in this
    process (built from ``local_args``, default ``args(0)``, on ``device``), else a pool of
    ``run.runners`` Ray actors, worker ``i`` built from ``args(i)`` on the CPU and rebuilt
    (then ``on_restart(i)``) when it dies. Either answers ``call_all`` and ``call_each``."""
    if run.runners == 0:
        # The worker's network is overwritten by set_weights: building it must not move the
        # torch generator that initializes the learner's (as Ray workers do not).
        with torch.random.fork_rng(devices=[]):
            worker = worker_cls(*(args(0) if local_args is None else local_args),
                                device=str(device))  # fmt: skip
        return InProcessPool([worker])
    if device.type != "cpu":
        raise ConfigError(
            f"run.device = {run.device!r} with run.runners > 0: the self-play workers search "
            "on the CPU; use run.runners 0 to search on the device"
        )
    from shoal.distributed import require_ray

    workers = require_ray()
    workers.connect(run.ray_address, num_cpus=max(os.cpu_count() or 1, run.runners + 1))
    return workers.WorkerPool(worker_cls, args, run.runners, name="self-play",
                              max_restarts=run.max_worker_restarts,
                              on_restart=on_restart)  # fmt: skip
