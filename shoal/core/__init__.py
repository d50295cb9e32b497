"""The ground floor, beside the settings (`shoal.config`): what every floor above may use and
nothing here imports from above.

* `shoal.core.types`: the batches and outputs that cross between parts (named fields, never
  string keys).
* `shoal.core.errors`: the errors shoal raises to users (`ShoalError` and its kinds).
* `shoal.core.interfaces`: the protocols an algorithm, a sampler and a policy fulfil.
* `shoal.core.device`, `shoal.core.seeding`, `shoal.core.threads`: devices and precision, the
  seeds derived from a run's one seed, the compute threads a process uses.
* `shoal.core.stats`: summaries over seeds and episodes (mean, IQM, bootstrap intervals).
* `shoal.core.imports`: users' code named by a ``module:Name`` string (custom envs, wrappers,
  encoders, callbacks), imported only where the user allows it.
"""
