"""Settings the board-game tests of AlphaZero and MuZero share."""


def shallow_minimax(env_id: str) -> dict:
    """Perfect play on PettingZoo's tic-tac-toe replays the game from its start for each
    move it looks at (about 20 s to solve the game on one core, once per evaluation), so
    its smoke tests' minimax player looks 2 moves ahead; OpenSpiel's smoke test and the
    learning test evaluate against perfect play."""
    return {"minimax_depth": 2} if env_id.startswith("pettingzoo:") else {}
