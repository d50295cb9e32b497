"""Learners that plan with search: AlphaZero (MuZero to follow)."""
