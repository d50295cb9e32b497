"""Learners that plan with search: AlphaZero (a game's rules) and MuZero (a learned model)."""
