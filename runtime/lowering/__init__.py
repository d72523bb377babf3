"""The interpreter: an IR's ops and graphs lowered to JAX functions, with calls, loops,
repeated calls as scans over stacked state, and autodiff's pullbacks."""
