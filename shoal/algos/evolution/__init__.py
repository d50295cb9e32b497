"""Derivative-free learners: evolution strategies, augmented random search, a genetic
algorithm and CMA-ES, over whole populations evaluated in batches."""
