"""Capture: a ``torch.nn.Module``'s ``forward`` as a popxl graph.

* ``export``: ``torch.export`` of the forward and its decomposition to core ATen (with
  ``composite``, the fallback that keeps an op whole where torch cannot decompose it);
* ``blocks``: identical repeated submodules captured once, called once per block;
* ``arguments``: a call's arguments bound to ``forward``'s signature and flattened
  (``transformers_cache``: transformers' cache objects as pytrees);
* ``scopes``: ``poptorch.NameScope`` and ``Attribute`` around the ops a forward makes;
* ``translate``: each ATen node through the table (``poptorch.aten``) into popxl ops, with
  ``control`` for loops, branches and MultiConv regions and ``describe`` for errors that
  point at the user's module and line;
* ``buffer_guard``, ``cpu_tensors``, ``overlap``, ``redirects``, ``index_expansion``,
  ``scatter_groups``: PopTorch's checks and rewrites of the captured program;
* ``model``: the captured program in the shape the program builder takes.
"""
