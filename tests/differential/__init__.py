"""Differential testing: random valid PopXL programs run by popxl.Session and by a NumPy/JAX
reference, compared value by value; failures shrink to a minimal printed program."""
