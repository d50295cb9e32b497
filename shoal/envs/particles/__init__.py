"""Vectorized multi-agent particle worlds (the MPE of Lowe et al. 2017), built in.

Every array holds the whole env batch ``[B, ...]``; a step is a few dozen numpy operations
whatever ``B`` is (no per-env Python loop). All envs implement the multi-agent vector-env
protocol of `shoal.envs.multi_agent`: one group ``"agent"`` with agents ``agent_0 ..
agent_{N-1}``, a global state for centralized critics, next-step autoreset, per-agent episode
returns (`EpisodeTracker`), ``get_state``/``set_state`` and an RGB ``render`` of env 0.

Registered ids (`register_multi_agent_env`; ``EnvConfig.kwargs`` go to the constructor,
``EnvConfig.max_episode_steps`` overrides the episode length):

==========================  ======  =========  =====  ==========================================
id                          agents  landmarks  steps  observation per agent
==========================  ======  =========  =====  ==========================================
``shoal/spread-v0``         3       3          25     vel, pos, landmark rel pos, others rel pos
``shoal/cn-v1-v0``          3       3          25     distances to others and to landmarks
``shoal/cn-v2-v0``          3       2          25     distances to others and to landmarks
``shoal/push-forward-v0``   3       3          50     distances to others and to landmarks
``shoal/predator-prey-v0``  3       2 (preys)  50     distances to others and to preys
==========================  ======  =========  =====  ==========================================

``shoal/tag-v0`` (`shoal.envs.particles.tag`) has two groups that learn against each other:
three predators (``adversary``) and a prey (``agent``) among two obstacles, MPE's
``simple_tag``. ``shoal/predator-prey-v0`` with ``prey="learned"`` makes its preys a second,
learning group ``prey``.

The four tasks after spread are the benchmarks of Chen 2019 (CTEDD, section 5.1); see each class for
the choices made where the paper is vague. Every observation ends with the messages the
*other* agents sent on the previous step (agent order, ``message_dim`` each; zeros after a
reset).

Physics (MPE's constants, mpe2 ``_mpe_utils/core.py``): ``dt = 0.1``, damping 0.25, mass 1,
action sensitivity (MPE's ``accel``) 5.0, no maximum speed. Agents have size (radius) 0.15
and collide with each other through MPE's soft contact force: for every pair,
``penetration = k * log(1 + exp(-(dist - (size_a + size_b)) / k))`` with margin ``k = 1e-3``
and force ``1e2 * penetration * (p_a - p_b) / dist`` on ``a`` (opposite on ``b``). Landmarks
(size 0.05) never collide; they are static, or moved by rules (push forward, predator-prey).
Integration is semi-implicit Euler as in the original MPE and PettingZoo's MPE::

    velocity = velocity * (1 - damping) + force / mass * dt
    position = position + velocity * dt

(the installed mpe2 moves positions with the *old* velocity first; we keep the original
order). Initial agent and landmark positions are uniform in ``[-1, 1]^2``, velocities 0.

Actions (one per agent):

* ``continuous=False`` (default): ``Discrete(5)``: 0 no-op, 1 left (-x), 2 right (+x), 3 down
  (-y), 4 up (+y), as MPE; the force is 5.0 along that direction.
* ``continuous=True``: ``Box(-1, 1, (2 + message_dim,))``: the first two entries, clipped to
  ``[-1, 1]``, are the force along x and y (times 5.0; the discrete actions are the corners
  ``(+-1, 0)``, ``(0, +-1)``). mpe2's ``Box(0, 1, (5,))`` form ``(noop, -x, +x, -y, +y)`` maps
  to ours as ``(a[2] - a[1], a[4] - a[3])``. The remaining ``message_dim`` entries, clipped
  to ``[-1, 1]``, are the message the agent broadcasts; the others observe it on the next
  step. Messages need continuous actions (``message_dim`` > 0 with discrete actions is an
  error).

Global state ``[B, S]``: agent positions ``(2N)``, agent velocities ``(2N)``, landmark
positions ``(2L)``, landmark velocities ``(2L)`` (displacement / dt for rule-moved
landmarks), messages ``(N * message_dim)``.

Hand-placing a configuration (tests, demos): write the public arrays ``agent_pos``,
``agent_vel`` ``[B, N, 2]``, ``landmark_pos``, ``landmark_vel`` ``[B, L, 2]``, ``messages``
``[B, N, M]`` or ``t`` ``[B]`` (float32 / int), then call `ParticleEnv.refresh` (or use
`ParticleEnv.set_positions`, which does both); `ParticleEnv.observe` returns the
observations and state of the current configuration.
"""

from shoal.envs.particles.tag import TagEnv
from shoal.envs.particles.tasks import (
    ENVS,
    CooperativeNavigationV1Env,
    CooperativeNavigationV2Env,
    PredatorPreyEnv,
    PushForwardEnv,
    SpreadEnv,
)
from shoal.envs.particles.world import ParticleEnv

__all__ = [
    "ENVS",
    "CooperativeNavigationV1Env",
    "CooperativeNavigationV2Env",
    "ParticleEnv",
    "PredatorPreyEnv",
    "PushForwardEnv",
    "SpreadEnv",
    "TagEnv",
]
