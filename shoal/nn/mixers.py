"""Value-decomposition networks for cooperative multi-agent Q-learning: the recurrent agent
that every agent of a group shares, and the mixers that combine the agents' chosen Q-values
into a team value ``Q_tot``.

* `RecurrentAgent`: MLP -> GRU cell -> one Q-value per action (DRQN-style, as pymarl's
  ``RNNAgent``); its input is the agent's own observation, its one-hot id and optionally its
  last action, so one set of weights serves every agent of the group.
* `QMixer`: QMIX's monotonic mixing network (Rashid et al. 2018, section 4.2): the weights
  of a one-hidden-layer network over the agents' Q-values are produced by hypernetworks from
  the global state and passed through ``abs``, so ``dQ_tot / dQ_a >= 0`` for every agent.
* `VDNMixer`: ``Q_tot = sum_a Q_a`` (Sunehag et al. 2018).

`RecurrentQPolicy` deploys a trained `RecurrentAgent` behind `shoal.nn.policy.ActorPolicy`.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from shoal.nn.mlp import MLP


class RecurrentAgent(nn.Module):
    """``[M, in_dim]`` inputs and ``[M, rnn_hidden]`` states -> ``[M, num_actions]`` Q-values
    and the next states; ``M`` is any flattening of (env, agent) rows."""

    def __init__(
        self,
        in_dim: int,
        hidden: tuple[int, ...],
        rnn_hidden: int,
        num_actions: int,
        activation: str = "relu",
    ):
        super().__init__()
        self.encoder = MLP(in_dim, hidden, activation)
        self.rnn = nn.GRUCell(self.encoder.out_dim, rnn_hidden)
        self.head = nn.Linear(rnn_hidden, num_actions)
        self.in_dim, self.rnn_hidden, self.num_actions = in_dim, rnn_hidden, num_actions

    def initial_state(self, rows: int) -> torch.Tensor:
        return torch.zeros(rows, self.rnn_hidden, device=self.head.weight.device)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.rnn(self.encoder(x), h)
        return self.head(h), h

    def unroll(self, inputs: torch.Tensor) -> torch.Tensor:
        """Q-values ``[T, M, A]`` of sequences ``[T, M, in_dim]`` that start at episode starts
        (zero state)."""
        h = self.initial_state(inputs.shape[1])
        # The MLP runs on all steps at once; only the GRU needs the loop over time.
        encoded = self.encoder(inputs)
        states = []
        for t in range(inputs.shape[0]):
            h = self.rnn(encoded[t], h)
            states.append(h)
        return self.head(torch.stack(states))


class GreedyChoice:
    """`ActorPolicy`'s distribution: ``mode()`` greedy, ``sample()`` epsilon-greedy."""

    def __init__(self, q: torch.Tensor, epsilon: float):
        self.q, self.epsilon = q, epsilon

    def mode(self) -> torch.Tensor:
        return self.q.argmax(-1)

    def sample(self) -> torch.Tensor:
        q = self.q
        random = torch.randint(q.shape[-1], q.shape[:-1], device=q.device)
        return torch.where(
            torch.rand(q.shape[:-1], device=q.device) < self.epsilon, random, self.mode()
        )


class RecurrentQPolicy(nn.Module):
    """The deployable agent network on ``[M, obs_dim]`` rows of (env, agent) pairs, with its GRU
    state (and last actions) carried across calls. The state starts at zero and restarts on
    `reset_state` (all rows or some) or when the number of rows changes; a fresh policy per
    evaluation (as the training loop makes) runs every env's first episode exactly as in
    training."""

    def __init__(self, agent: RecurrentAgent, last_action: bool, epsilon: float = 0.0):
        super().__init__()
        self.agent, self.last_action, self.epsilon = agent, last_action, epsilon
        self._h: torch.Tensor | None = None
        self._last: torch.Tensor | None = None

    def reset_state(self, mask: torch.Tensor | None = None) -> None:
        """Zero the GRU state and last action: of every row, or of the rows where ``mask``
        ``[M]`` is True (their episode starts with the next call)."""
        if mask is None or self._h is None:
            self._h = self._last = None
            return
        keep = (~torch.as_tensor(mask, dtype=torch.bool)).float().unsqueeze(-1)
        self._h = self._h * keep
        if self._last is not None:
            self._last = self._last * keep

    def distribution(self, obs: torch.Tensor) -> _Remember:
        rows = obs.shape[0]
        if self._h is None or self._h.shape[0] != rows or self._last is None:
            self._h = self.agent.initial_state(rows)
            self._last = torch.zeros(rows, self.agent.num_actions, device=obs.device)
        x = obs.float()
        if self.last_action:
            x = torch.cat([x, self._last], -1)
        q, self._h = self.agent(x, self._h)
        return _Remember(self, GreedyChoice(q, self.epsilon))


class _Remember:
    """Records the action the caller chose, for the next step's last-action input."""

    def __init__(self, policy: RecurrentQPolicy, choice: GreedyChoice):
        self.policy, self.choice = policy, choice

    def _keep(self, actions: torch.Tensor) -> torch.Tensor:
        self.policy._last = F.one_hot(actions, self.policy.agent.num_actions).float()
        return actions

    def mode(self) -> torch.Tensor:
        return self._keep(self.choice.mode())

    def sample(self) -> torch.Tensor:
        return self._keep(self.choice.sample())


class VDNMixer(nn.Module):
    """``Q_tot = sum_a Q_a``: ``[..., N]`` agent values -> ``[...]`` (the state is unused)."""

    def forward(self, agent_qs: torch.Tensor, state: torch.Tensor | None = None) -> torch.Tensor:
        del state
        return agent_qs.sum(-1)


class QMixer(nn.Module):
    """QMIX's monotonic mixer: ``[..., N]`` agent values and ``[..., S]`` states -> ``[...]``.

    ``Q_tot = w2(s) . elu(W1(s) q + b1(s)) + V(s)`` with ``W1 = |hyper_w1(s)|`` ``[N, E]``,
    ``w2 = |hyper_w2(s)|`` ``[E]``, ``b1`` a linear function of the state and ``V`` a
    two-layer hypernetwork (ReLU), as in the paper and pymarl. ``hypernet_layers = 2`` puts a
    ReLU layer of ``hypernet_embed`` units inside the weight hypernetworks (pymarl's option).
    """

    def __init__(
        self,
        n_agents: int,
        state_dim: int,
        embed_dim: int = 32,
        hypernet_layers: int = 1,
        hypernet_embed: int = 64,
    ):
        super().__init__()
        self.n_agents, self.embed_dim = n_agents, embed_dim

        def hyper(out: int) -> nn.Module:
            if hypernet_layers == 1:
                return nn.Linear(state_dim, out)
            return nn.Sequential(
                nn.Linear(state_dim, hypernet_embed), nn.ReLU(), nn.Linear(hypernet_embed, out)
            )

        self.hyper_w1 = hyper(n_agents * embed_dim)
        self.hyper_w2 = hyper(embed_dim)
        self.hyper_b1 = nn.Linear(state_dim, embed_dim)
        self.hyper_v = nn.Sequential(
            nn.Linear(state_dim, embed_dim), nn.ReLU(), nn.Linear(embed_dim, 1)
        )

    def mixing_weights(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The non-negative weights ``W1 [M, N, E]`` and ``w2 [M, E]`` for states ``[M, S]``."""
        w1 = self.hyper_w1(state).abs().view(-1, self.n_agents, self.embed_dim)
        return w1, self.hyper_w2(state).abs()

    def forward(self, agent_qs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        lead = agent_qs.shape[:-1]
        qs = agent_qs.reshape(-1, 1, self.n_agents)
        s = state.reshape(qs.shape[0], -1)
        w1, w2 = self.mixing_weights(s)
        hidden = F.elu(torch.bmm(qs, w1).squeeze(1) + self.hyper_b1(s))
        q_tot = (hidden * w2).sum(-1, keepdim=True) + self.hyper_v(s)
        return q_tot.view(lead)


__all__ = ["GreedyChoice", "QMixer", "RecurrentAgent", "RecurrentQPolicy", "VDNMixer"]
