"""The compiled step (``program``) and ``popxl.Session``, which runs it: host streams,
variables on host and device, remote buffers and the executable cache."""
