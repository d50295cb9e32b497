"""Two-player turn-based games as true models for search (AlphaZero, minimax players).

A `Game` is stateless; its states are values it hands out and takes back, never changed in
place (`play` returns a new state), so a search can branch from any node. Two adapters:

* `OpenSpielGame`: any OpenSpiel game of two players taking turns with deterministic moves
  (``openspiel:tic_tac_toe``, ``openspiel:connect_four``, ``openspiel:breakthrough``, ...);
  states are OpenSpiel states, cloned (in C++) to branch.
* `PettingZooGame`: a PettingZoo AEC (turn-based) game with action masks
  (``pettingzoo:pettingzoo.classic.tictactoe_v3``, ``...connect_four_v3``); states are
  the moves from the seeded start, branched by replaying them on a new env (PettingZoo's envs
  cannot be copied: their pickling rebuilds a fresh env).

Observations are from the side of the player to move, channels first: PettingZoo's classic
boards already are (mover's pieces, opponent's pieces; transposed to ``[C, H, W]``);
OpenSpiel's tensors are absolute, so a constant plane saying who moves is appended.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

import numpy as np

from shoal.core.errors import ConfigError
from shoal.core.types import StepResult


class Game(Protocol):
    """A two-player, deterministic, turn-based game with ``num_actions`` actions and
    observations of ``observation_shape``."""

    num_actions: int
    observation_shape: tuple[int, ...]

    def initial(self, seed: int = 0) -> Any: ...

    def to_move(self, state: Any) -> int:
        """The player (0 or 1) whose turn it is (undefined once the game is over)."""
        ...

    def legal(self, state: Any) -> np.ndarray:
        """``[num_actions]`` bool: the legal moves (none once the game is over)."""
        ...

    def observation(self, state: Any) -> np.ndarray:
        """The state as the player to move sees it, float32 of ``observation_shape``."""
        ...

    def play(self, state: Any, action: int) -> tuple[Any, float, bool]:
        """``(next state, the mover's reward, game over)``; ``state`` is left unchanged."""
        ...

    def returns(self, state: Any) -> tuple[float, float]:
        """Each player's final outcome (+1 win, -1 loss, 0 draw for win/loss games)."""
        ...

    def key(self, state: Any) -> Any:
        """A hashable key equal for equal positions (for memoizing searches)."""
        ...

    def history(self, state: Any) -> list[int]:
        """The moves played from the start (what a checkpoint keeps of a game)."""
        ...

    def replay(self, moves: list[int], seed: int = 0) -> Any:
        """The state after ``moves`` from the start seeded ``seed``."""
        ...


class OpenSpielGame:
    """An OpenSpiel game (``pyspiel.load_game(name)``) of two players taking turns."""

    def __init__(self, name: str):
        try:
            import pyspiel
        except ImportError as err:
            raise ConfigError(
                f"openspiel:{name} needs OpenSpiel: pip install 'shoal[openspiel]' "
                "(or pip install open-spiel)"
            ) from err
        check_openspiel_name(name)  # before load_game, which prints every game on a miss
        try:
            self.game = pyspiel.load_game(name)
        except pyspiel.SpielError as err:
            raise ConfigError(f"openspiel:{name}: OpenSpiel refused it ({err})") from err
        info = self.game.get_type()
        problems = []
        if self.game.num_players() != 2:
            problems.append(f"{self.game.num_players()} players")
        if info.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
            problems.append("simultaneous moves")
        if info.chance_mode != pyspiel.GameType.ChanceMode.DETERMINISTIC:
            problems.append("chance nodes")
        if info.information != pyspiel.GameType.Information.PERFECT_INFORMATION:
            problems.append("hidden information")
        if problems:
            raise ConfigError(
                f"openspiel:{name} cannot be searched as a two-player turn-based game with "
                f"deterministic moves and perfect information: it has {', '.join(problems)}"
            )
        self.name = name
        self.num_actions = int(self.game.num_distinct_actions())
        shape = tuple(self.game.observation_tensor_shape())
        self._board = len(shape) == 3
        self.observation_shape = (shape[0] + 1, *shape[1:]) if self._board else (shape[0] + 1,)
        self._shape = shape

    def initial(self, seed: int = 0) -> Any:
        return self.game.new_initial_state()

    def to_move(self, state: Any) -> int:
        return int(state.current_player())

    def legal(self, state: Any) -> np.ndarray:
        if state.is_terminal():
            return np.zeros(self.num_actions, bool)
        return np.asarray(state.legal_actions_mask(), bool)[: self.num_actions]

    def observation(self, state: Any) -> np.ndarray:
        player = 0 if state.is_terminal() else state.current_player()
        tensor = np.asarray(state.observation_tensor(player), np.float32).reshape(self._shape)
        plane = np.full((1, *self._shape[1:]) if self._board else (1,), float(player), np.float32)
        return np.concatenate([tensor, plane], axis=0)

    def play(self, state: Any, action: int) -> tuple[Any, float, bool]:
        mover = state.current_player()
        nxt = state.clone()
        nxt.apply_action(int(action))
        done = nxt.is_terminal()
        return nxt, float(nxt.returns()[mover]) if done else 0.0, done

    def returns(self, state: Any) -> tuple[float, float]:
        first, second = state.returns()
        return float(first), float(second)

    def key(self, state: Any) -> Any:
        return str(state), int(state.current_player())

    def history(self, state: Any) -> list[int]:
        return [int(move) for move in state.history()]

    def replay(self, moves: list[int], seed: int = 0) -> Any:
        state = self.game.new_initial_state()
        for move in moves:
            state.apply_action(int(move))
        return state


class Position:
    """A PettingZoo game's state: the moves played from the seeded start, and the env that
    played them. PettingZoo's envs cannot be copied (their pickling rebuilds a fresh env from
    the constructor's arguments), so a branch replays the moves on a new env: exact for
    deterministic games, and cheap for short ones."""

    __slots__ = ("moves", "seed", "env")

    def __init__(self, moves: tuple[int, ...], seed: int, env: Any):
        self.moves, self.seed, self.env = moves, seed, env


class PettingZooGame:
    """A PettingZoo AEC game of two players with ``action_mask`` observations."""

    def __init__(self, module: str):
        try:
            self._module = importlib.import_module(module)
        except ImportError as err:
            raise ConfigError(f"pettingzoo:{module}: cannot import it ({err})") from err
        if not hasattr(self._module, "env"):
            raise ConfigError(f"pettingzoo:{module} has no env() (not a PettingZoo AEC game)")
        env = self._module.env()
        env.reset(seed=0)
        self.agents = list(env.possible_agents)
        if len(self.agents) != 2:
            raise ConfigError(f"pettingzoo:{module} has {len(self.agents)} players, not 2")
        first = env.observe(env.agent_selection)
        if not isinstance(first, dict) or "action_mask" not in first:
            raise ConfigError(
                f"pettingzoo:{module} gives no action masks: search needs the legal moves "
                "(PettingZoo's classic games give them as observation['action_mask'])"
            )
        self.num_actions = int(env.action_space(self.agents[0]).n)
        board = np.asarray(first["observation"])
        self._channels_last = board.ndim == 3
        self.observation_shape = self._canonical(board).shape
        self.module = module

    def _canonical(self, board: np.ndarray) -> np.ndarray:
        board = np.asarray(board, np.float32)
        return np.moveaxis(board, -1, 0) if self._channels_last else board

    def _replay(self, moves: tuple[int, ...], seed: int) -> Position:
        env = self._module.env()
        env.reset(seed=seed)
        for move in moves:
            env.step(move)
        return Position(moves, seed, env)

    def initial(self, seed: int = 0) -> Position:
        return self._replay((), seed)

    def history(self, state: Position) -> list[int]:
        return list(state.moves)

    def replay(self, moves: list[int], seed: int = 0) -> Position:
        return self._replay(tuple(int(m) for m in moves), seed)

    def _over(self, env: Any) -> bool:
        return not env.agents or all(
            env.terminations[a] or env.truncations[a] for a in env.agents
        )  # fmt: skip

    def to_move(self, state: Position) -> int:
        return self.agents.index(state.env.agent_selection)

    def legal(self, state: Position) -> np.ndarray:
        env = state.env
        if self._over(env):
            return np.zeros(self.num_actions, bool)
        return np.asarray(env.observe(env.agent_selection)["action_mask"], bool)

    def observation(self, state: Position) -> np.ndarray:
        return self._canonical(state.env.observe(state.env.agent_selection)["observation"])

    def play(self, state: Position, action: int) -> tuple[Position, float, bool]:
        mover = state.env.agent_selection
        nxt = self._replay((*state.moves, int(action)), state.seed)
        done = self._over(nxt.env)
        return nxt, float(nxt.env.rewards.get(mover, 0.0)), done

    def returns(self, state: Position) -> tuple[float, float]:
        rewards = state.env._cumulative_rewards
        return float(rewards[self.agents[0]]), float(rewards[self.agents[1]])

    def key(self, state: Position) -> Any:
        return self.observation(state).tobytes(), state.env.agent_selection


def check_openspiel_name(name: str) -> None:
    """Refuse a game OpenSpiel does not register, naming the closest ones (OpenSpiel's own
    error lists all of its games, twice over)."""
    import difflib

    import pyspiel

    base = name.split("(", 1)[0]  # tic_tac_toe(param=...) names tic_tac_toe
    known = list(pyspiel.registered_names())
    if base not in known:
        close = difflib.get_close_matches(base, known, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(
            f'openspiel:{name}: OpenSpiel has no game {base!r}.{hint} (python -c "import '
            'pyspiel; print(pyspiel.registered_names())" lists them)'
        )


def make_game(env_id: str) -> Game:
    """The game named by an env id: ``openspiel:<game>`` or ``pettingzoo:<module>``."""
    if env_id.startswith("openspiel:"):
        return OpenSpielGame(env_id.removeprefix("openspiel:"))
    if env_id.startswith("pettingzoo:"):
        return PettingZooGame(env_id.removeprefix("pettingzoo:"))
    raise ConfigError(
        f"env.id {env_id!r} is not a two-player game: search plays openspiel:<game> "
        "(e.g. openspiel:tic_tac_toe, openspiel:connect_four) or a PettingZoo turn-based "
        "game with action masks (e.g. pettingzoo:pettingzoo.classic.tictactoe_v3)"
    )


def is_game_id(env_id: str) -> bool:
    """Whether ``env_id`` names a two-player game (`make_game`'s ids)."""
    return env_id.startswith(("openspiel:", "pettingzoo:"))


class GameVectorEnv:
    """``num_envs`` games of ``game`` as a single-agent vector env of self-play (shoal's
    `shoal.envs.base.VectorEnv`): each step is the move of whoever is to move, the
    observation is the next mover's, the reward the mover's, and ``action_mask`` the next
    mover's legal moves. A learner that plays it plays both sides, with a discount of -1
    (MuZero on board games). Next-step autoreset as everywhere in shoal; an episode's
    return is its first player's outcome."""

    agents_per_env = 1
    agent_names = None

    def __init__(self, game: Game, num_envs: int):
        import gymnasium as gym

        self.game, self.num_envs = game, num_envs
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, game.observation_shape,
                                                np.float32)  # fmt: skip
        self.action_space = gym.spaces.Discrete(game.num_actions)
        self.states: list[Any] = []
        self.seeds: list[int] = []
        self.done = np.zeros(num_envs, bool)
        self.lengths = np.zeros(num_envs, np.int64)
        self._rng = np.random.default_rng(0)

    @property
    def action_mask(self) -> np.ndarray:
        return np.stack([self.game.legal(s) for s in self.states])

    def _observe(self) -> np.ndarray:
        return np.stack([self.game.observation(s) for s in self.states]).astype(np.float32)

    def _new_game(self, b: int) -> None:
        seed = int(self._rng.integers(2**31))
        self.seeds[b], self.states[b] = seed, self.game.initial(seed)
        self.done[b], self.lengths[b] = False, 0

    def reset(self, seed: int | None = None) -> np.ndarray:
        self._rng = np.random.default_rng(seed)
        self.states, self.seeds = [None] * self.num_envs, [0] * self.num_envs
        for b in range(self.num_envs):
            self._new_game(b)
        return self._observe()

    def step(self, actions: np.ndarray) -> StepResult:
        count = self.num_envs
        reward = np.zeros(count, np.float32)
        terminated = np.zeros(count, bool)
        autoreset = self.done.copy()
        returns, lengths = [], []
        for b in range(count):
            if autoreset[b]:
                self._new_game(b)
                continue
            state = self.states[b]
            if not self.game.legal(state)[int(actions[b])]:
                raise ValueError(f"illegal move {int(actions[b])} in game {b}")
            self.states[b], reward[b], terminated[b] = self.game.play(state, int(actions[b]))
            self.lengths[b] += 1
            if terminated[b]:
                self.done[b] = True
                returns.append(self.game.returns(self.states[b])[0])
                lengths.append(self.lengths[b])
        return StepResult(self._observe(), reward, terminated, np.zeros(count, bool), autoreset,
                          np.array(returns, np.float32), np.array(lengths, np.int64),
                          self.action_mask)  # fmt: skip

    def get_state(self) -> dict[str, Any]:
        return {
            "games": [self.game.history(s) for s in self.states],
            "seeds": list(self.seeds),
            "done": self.done.copy(),
            "lengths": self.lengths.copy(),
            "rng": self._rng.bit_generator.state,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self.seeds = [int(s) for s in state["seeds"]]
        self.states = [self.game.replay(list(moves), seed) for moves, seed in
                       zip(state["games"], self.seeds, strict=True)]  # fmt: skip
        self.done = np.asarray(state["done"], bool).copy()
        self.lengths = np.asarray(state["lengths"], np.int64).copy()
        self._rng.bit_generator.state = state["rng"]

    def render(self) -> None:
        return None

    def close(self) -> None:
        pass
