"""Several processes: ``poprun``'s launcher, the environment it gives each instance, and the
instances joined with ``jax.distributed``."""
