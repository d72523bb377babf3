"""How XLA's backends are asked: the CPU's convolution and pool forms, transposes sunk
between them, compiler options and workarounds, and the host's allocator and dispatch."""
