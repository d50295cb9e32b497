"""Settings checks the on-policy learners share: recurrent chunks, legal-action masks (which
learners train with them, and which refuse them), and what a learner group cannot split."""

from __future__ import annotations

import dataclasses
from typing import Any

from shoal.config import check, check_positive
from shoal.core.errors import ConfigError


def check_bptt_chunk(config: Any) -> None:
    """Validate ``bptt_chunk`` of a config with ``model.lstm_hidden``, ``num_steps`` and a
    ``chunk`` property (the chunk length in effect)."""
    if config.model.lstm_hidden is None:
        check(config, "bptt_chunk", config.bptt_chunk is None, "needs model.lstm_hidden set")
        return
    if config.bptt_chunk is not None:
        check_positive(config, "bptt_chunk")
    check(
        config,
        "bptt_chunk",
        config.num_steps % config.chunk == 0,
        f"must divide num_steps = {config.num_steps}",
    )


def check_masks(config: Any, algo: str) -> None:
    """Legal-action masks (``env.action_mask``) train through autograd and feed-forward
    models: the learner restricts the policy to the actions that were legal, as the sampler
    did (`evaluate_objective`)."""
    if config.env.action_mask == "none":
        return
    check(
        config.model,
        "backend",
        config.model.backend != "numpy",
        f"{algo} with env.action_mask trains through autograd: use auto or torch",
    )
    check(
        config.model,
        "lstm_hidden",
        config.model.lstm_hidden is None,
        "recurrent models do not support action masks yet; set env.action_mask to none",
    )


NO_MASKS = "does not use action masks yet (PPO, A2C and TRPO do)"


def check_no_masks(config: Any, algo: str) -> None:
    """For the learners that do not restrict their policy to legal actions: refuse
    ``env.action_mask`` (`masked_config` refuses the masks an env reports by itself)."""
    env = config.env
    check(env, "action_mask", env.action_mask == "none", f"{algo} {NO_MASKS}; set it to none")


def masked_config(config: Any, algo: str, supported: bool) -> Any:
    """``config`` for a learner whose rollouts carry legal-action masks: the masked policy
    trains through autograd (the NumPy path has no masks), so ``auto`` becomes ``torch``."""
    if not supported:
        raise ConfigError(f"{algo} {NO_MASKS}, and this env reports them")
    if config.model.backend == "numpy":
        raise ConfigError(
            "model.backend = 'numpy' cannot train with the action masks this env reports; "
            "use auto or torch"
        )
    model = dataclasses.replace(config.model, backend="torch")
    return dataclasses.replace(config, model=model)


def check_learner_group(config: Any, algo: str, step_samples: int) -> None:
    """With ``run.learners`` > 1 (`shoal.algos.cores.learner_group`): each gradient step's
    ``step_samples`` split among the learners, a feed-forward model, and a temperature that
    does not change during the run (the learners hold the weights it is a buffer of)."""
    learners = config.run.learners
    if learners == 1:
        return
    check(
        config.run,
        "learners",
        step_samples >= learners,
        f"must be <= the {step_samples} samples of each of {algo}'s gradient steps",
    )
    check(
        config.model,
        "lstm_hidden",
        config.model.lstm_hidden is None,
        f"{algo}'s learner groups split feed-forward minibatches; train recurrent models with "
        "run.learners 1",
    )
    check(
        config.model,
        "temperature_min",
        config.model.temperature_min is None,
        f"{algo}'s learner groups keep the temperature constant; set it to None or use "
        "run.learners 1",
    )
