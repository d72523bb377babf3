"""Virtual IPUs on JAX devices: device descriptions, placement of each IPU's ops and
variables, and per-IPU memory reports."""
