"""Running a model: ``trainingModel``, ``inferenceModel`` and the ``PoplarExecutor`` they return.

* ``executor``: the executor (compiling on the first call, weights, the device, export/import
  of compiled steps); ``torch_executor`` its ``torch.nn`` front end (capture on the first call,
  weights kept in the torch model);
* ``program``: the one popxl program a call runs (device iterations, gradient accumulation,
  replica reductions, the optimiser step), with ``storage`` (where weights and optimiser state
  live), ``anchors`` (tensors the host asks for), ``host_io`` (the model's inputs and outputs),
  ``staged`` (blocks placed, pipelined or phased) and ``instances`` (several ``poprun``
  instances);
* ``hooks``: user callables run around compilation.
"""

from __future__ import annotations
