"""``Module``: build graphs with state, inline or outlined, with optional custom gradients.

A module's ``build`` describes a graph. Variables are declared inside it with
``add_variable_input``, which adds a graph input and a factory; ``create_graph`` returns
the factories and the graph, so the module instance holds no state and can be reused.
Submodules assigned as attributes are *inlined* into the parent's graph under a name scope
of their attribute name; to *outline* (share code), use ``create_graph`` +
``add_variable_inputs`` + ``bind`` + ``call``.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import popxl
from popxl.transforms import ExpectedConnectionType, GradGraphInfo
from popxl.transforms.autodiff import add_graph_output, make_grad_graph_info

from .dot_tree import DotTree
from .graph import BoundGraph, GraphWithNamedArgs
from .graph_cache import GraphCache, tensor_arguments
from .named_tensors import NamedTensors
from .utils import overrides
from .variable_factory import (
    NamedVariableFactories,
    VariableFactory,
    add_replica_sharded_variable_input,
    add_variable_input,
)

CACHE_WITH_GRAD_MSG = (
    "You cannot use graph caching if you have implemented `build_grad`: a cached graph would be "
    "shared between modules whose gradient graphs hold different aux state. Use cache=False."
)
INLINE_GRAD_MSG = (
    "{cls}: `build_grad` has been implemented, but the module is being called inline, so its "
    "custom gradient would be ignored. Use create_graph or call_module to outline it, or "
    "construct it with grad_inlining_error='warning' or 'none'."
)
SUPER_INIT_MSG = (
    "{cls}.{key} is a Module, but {cls}.__init__ has not called super().__init__() yet. Call "
    "it before assigning submodules: their variables are registered in the parent."
)
AUX_READ_IN_BUILD_MSG = (
    "aux['{key}']: you can only get items within the `build_graph` method (`build_grad`, called "
    "via `create_grad_graph` or `autodiff`); in `build` aux is write-only."
)
AUX_WRITE_IN_GRAD_MSG = (
    "aux['{key}']: aux is read-only in `build_grad`; set items in `build`, where the forward "
    "values exist."
)
BUILD_GRAD_VARIADIC_MSG = (
    "{cls}: the `build_grad` method signature must only have a fixed number of positional "
    "parameters as inputs. Not a positional parameter: {name}. Each parameter becomes a named "
    "input of the gradient graph, one per tensor in grads_provided: def build_grad(self, dy)."
)
VAR_GRAD_OUTSIDE_MSG = (
    "You can only use `var_grad` within the `build_graph` method (`build_grad`, called via "
    "`create_grad_graph` or `autodiff`)."
)

_BUILDING: list[Module] = []


def _scoped(build: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(build)
    def scoped_build(self: Module, *args: Any, **kwargs: Any) -> Any:
        scope = getattr(self, "_name_scope", None)
        if scope:
            with popxl.name_scope(scope):
                return build(self, *args, **kwargs)
        return build(self, *args, **kwargs)

    return scoped_build


class NameScopeMeta(type):
    """Runs every ``build`` defined in a class body inside the module's name scope."""

    def __new__(mcs, name: str, bases: tuple, namespace: dict[str, Any]) -> NameScopeMeta:
        if "build" in namespace:
            namespace["build"] = _scoped(namespace["build"])
        return super().__new__(mcs, name, bases, namespace)


class _Aux:
    """Forward values saved in ``build`` for ``build_grad``."""

    def __init__(self) -> None:
        self.store: dict[str, Any] = {}
        self.reads: dict[str, popxl.Tensor] = {}
        self.grad_mode = False

    def __setitem__(self, key: str, value: Any) -> None:
        if self.grad_mode:
            raise RuntimeError(AUX_WRITE_IN_GRAD_MSG.format(key=key))
        self.store[key] = value

    def __getitem__(self, key: str) -> Any:
        if not self.grad_mode:
            raise RuntimeError(AUX_READ_IN_BUILD_MSG.format(key=key))
        value = self.store[key]
        if not isinstance(value, popxl.Tensor):
            return value
        if key not in self.reads:
            self.reads[key] = popxl.graph_input(
                value.shape, value.dtype, key, meta_shape=value.meta_shape
            )
        return self.reads[key]

    def __contains__(self, key: str) -> bool:
        return key in self.store

    def copy(self) -> _Aux:
        new = _Aux()
        new.store = dict(self.store)
        return new


class _VarGrads:
    """Gradients of variables, declared in ``build_grad`` by flat key."""

    def __init__(self, module: Module) -> None:
        self._module = module
        self.grads: dict[str, popxl.Tensor] = {}
        self.active = False
        self.args: NamedTensors = NamedTensors()

    def __setitem__(self, key: str, value: Any) -> None:
        if not self.active:
            raise RuntimeError(VAR_GRAD_OUTSIDE_MSG)
        if not isinstance(value, popxl.Tensor):
            raise TypeError(f"Not a tensor: var_grad['{key}'] = {value!r}; assign a popxl.Tensor.")
        variables = self.args.to_dict()
        if key not in variables:
            raise KeyError(f"Not a variable: '{key}'. Possible inputs: {list(variables)}")
        var = variables[key]
        if value.shape != var.shape or value.meta_shape != var.meta_shape:
            raise ValueError(
                f"Shape or meta-shape of Tensor does not match variable. var_grad['{key}'] has shape "
                f"{value.shape} (meta-shape {value.meta_shape}); the variable has {var.shape} "
                f"(meta-shape {var.meta_shape})."
            )
        self.grads[key] = value

    def __getitem__(self, key: str) -> popxl.Tensor:
        if not self.active:
            raise RuntimeError(VAR_GRAD_OUTSIDE_MSG)
        return self.grads[key]

    def __contains__(self, key: object) -> bool:
        return key in self.grads


class _CalledGraphsGradInfoRefs:
    """Gradient graphs chosen for graphs this module calls (and its submodules' choices)."""

    def __init__(self) -> None:
        self.map: dict[popxl.Graph, GradGraphInfo] = {}
        self.submaps: list[_CalledGraphsGradInfoRefs] = []

    def add(self, fwd: popxl.Graph, grad: GradGraphInfo) -> None:
        self.map[fwd] = grad

    def add_submap(self, other: _CalledGraphsGradInfoRefs) -> None:
        self.submaps.append(other)

    def consolidate(self) -> dict[popxl.Graph, GradGraphInfo]:
        merged: dict[popxl.Graph, GradGraphInfo] = {}
        for sub in self.submaps:
            merged.update(sub.consolidate())
        merged.update(self.map)
        return merged

    def clear(self) -> None:
        self.map = {}


class Module(popxl.Module, metaclass=NameScopeMeta):
    """Base class for layers and models built with popxl-addons.

    Args:
        cache: reuse the graph (and its factories) when ``create_graph`` is called again
            with arguments of the same specs.
        grad_inlining_error: what to do when a module with ``build_grad`` is called inline:
            ``"error"``, ``"warning"`` or ``"none"``.
    """

    # Set with object.__setattr__ so that __setattr__ can tell whether __init__ ran.
    _variable_factories: NamedVariableFactories
    _named_inputs: NamedTensors
    _submodules: dict[str, Module]

    def __init__(self, cache: bool = False, grad_inlining_error: str = "error") -> None:
        object.__setattr__(self, "_variable_factories", NamedVariableFactories())
        object.__setattr__(self, "_named_inputs", NamedTensors())
        object.__setattr__(self, "_submodules", {})
        if grad_inlining_error not in ("error", "warning", "none"):
            raise ValueError(
                "grad_inlining_error should be one of 'error', 'warning', 'none'. "
                f"Not: {grad_inlining_error!r}"
            )
        if cache and self.implements_grad_graph:
            raise ValueError(CACHE_WITH_GRAD_MSG)
        self._graph_cache = GraphCache() if cache else None
        self._args_cache: dict[popxl.Graph, tuple[NamedVariableFactories, NamedTensors, dict]] = {}
        self._grad_inlining_error = grad_inlining_error
        self.aux = _Aux()
        self.var_grad = _VarGrads(self)
        self.called_graphs_grad_info = _CalledGraphsGradInfoRefs()

    def __setattr__(self, key: str, value: Any) -> None:
        if isinstance(value, Module):
            if "_variable_factories" not in self.__dict__:
                raise AttributeError(SUPER_INIT_MSG.format(cls=type(self).__name__, key=key))
            value.set_name_scope(key)
            self._variable_factories.insert(key, value._variable_factories)
            self._named_inputs.insert(key, value._named_inputs)
            self.called_graphs_grad_info.add_submap(value.called_graphs_grad_info)
            self._submodules[key] = value
        object.__setattr__(self, key, value)

    def set_name_scope(self, name: str) -> None:
        object.__setattr__(self, "_name_scope", name)

    @property
    def implements_grad_graph(self) -> bool:
        """True when the class overrides ``build_grad``."""
        return overrides(type(self), Module, "build_grad")

    # Building ---------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.implements_grad_graph and not (_BUILDING and _BUILDING[-1] is self):
            message = INLINE_GRAD_MSG.format(cls=type(self).__name__)
            if self._grad_inlining_error == "error":
                raise Exception(message)
            if self._grad_inlining_error == "warning":
                warnings.warn(message, UserWarning, stacklevel=2)
        return self.build(*args, **kwargs)

    def build_grad(self, *grads: popxl.Tensor) -> Any:
        """Override to write the gradient graph by hand (see ``create_grad_graph``)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement build_grad.")

    def create_graph(
        self, *args: Any, **kwargs: Any
    ) -> tuple[NamedVariableFactories, GraphWithNamedArgs]:
        """Build the module's graph; returns its variable factories and the graph.

        ``Tensor``/``TensorSpec`` arguments become graph inputs; other arguments are baked
        into the graph. The module is left empty and can build again.
        """
        if self._graph_cache is not None:
            return self._create_cached_graph(self._graph_cache, *args, **kwargs)
        self.aux = _Aux()
        _BUILDING.append(self)
        try:
            graph = popxl.gir().create_graph(self, *args, **kwargs)
        except BaseException:
            self._reset()  # so that a corrected call on the same instance can build again
            raise
        finally:
            _BUILDING.pop()
        if self.implements_grad_graph:
            graph._autodiff_safe = False
        gwna = GraphWithNamedArgs(
            graph,
            self._named_inputs.copy(),
            from_module=self,
            aux=self.aux.copy(),
            called_graphs_grad_info=self.called_graphs_grad_info.consolidate(),
        )
        factories = self._variable_factories.copy()
        self._reset()
        return factories, gwna

    def _create_cached_graph(
        self, cache: GraphCache, *args: Any, **kwargs: Any
    ) -> tuple[NamedVariableFactories, GraphWithNamedArgs]:
        _BUILDING.append(self)
        try:
            graph = cache.create_graph(self, *args, **kwargs)
        except BaseException:
            self._reset()
            raise
        finally:
            _BUILDING.pop()
        if graph not in self._args_cache:
            self._args_cache[graph] = (
                self._variable_factories.copy(),
                self._named_inputs.copy(),
                self.called_graphs_grad_info.consolidate(),
            )
            self._reset()
        factories, inputs, grad_infos = self._args_cache[graph]
        gwna = GraphWithNamedArgs(
            graph, inputs.copy(), from_module=self, called_graphs_grad_info=grad_infos
        )
        return factories.copy(), gwna

    def _reset(self) -> None:
        # Submodule links (made by __setattr__) stay, emptied; whatever build added goes, so
        # that the next build can add the same names again.
        for tree in (self._variable_factories, self._named_inputs):
            for key in tree.keys():
                if key not in self._submodules:
                    tree.pop(key)
        for child in self._submodules.values():
            child._reset()
        self.called_graphs_grad_info.clear()
        self.aux = _Aux()
        self.var_grad = _VarGrads(self)

    # Variables --------------------------------------------------------------------------

    def _register(
        self, name: str, tensor: popxl.Tensor, factory: VariableFactory, overwrite: bool
    ) -> popxl.Tensor:
        self._variable_factories.insert(name, factory, overwrite)
        self._named_inputs.insert(name, tensor, overwrite)
        return tensor

    def add_variable_input(
        self,
        name: str,
        data_iter: Any,
        dtype: popxl.dtype | None = None,
        by_ref: bool = False,
        replica_grouping: popxl.ReplicaGrouping | None = None,
        overwrite: bool = False,
    ) -> popxl.Tensor:
        """Declare a variable: a graph input named ``name`` plus a factory for it.

        Raises:
            ValueError: ``name`` already exists (unless ``overwrite``).
        """
        if name in self._variable_factories and not overwrite:
            raise ValueError(f"'{name}' already exists")
        tensor, factory = add_variable_input(name, data_iter, dtype, by_ref, replica_grouping)
        return self._register(name, tensor, factory, overwrite)

    def add_replica_sharded_variable_input(
        self,
        name: str,
        data_iter: Any,
        dtype: popxl.dtype | None = None,
        by_ref: bool = False,
        replica_grouping: popxl.ReplicaGrouping | None = None,
        shard_over: int | None = None,
    ) -> popxl.Tensor:
        """Declare a replica-sharded variable (the input is its flat shard)."""
        if name in self._variable_factories:
            raise ValueError(f"'{name}' already exists")
        tensor, factory = add_replica_sharded_variable_input(
            name, data_iter, dtype, by_ref, replica_grouping, shard_over
        )
        return self._register(name, tensor, factory, False)

    def add_variable_factory(
        self, variable_f: VariableFactory, name: str | None = None
    ) -> popxl.Tensor:
        """Register an existing factory and create its graph input.

        Raises:
            ValueError: neither ``name`` nor the factory's name is set, or the name exists.
        """
        key = name or variable_f.name
        if not key:
            raise ValueError(
                "add_variable_factory needs a name: pass `name=` or give the VariableFactory one."
            )
        if key in self._variable_factories:
            raise ValueError(f"'{key}' already exists")
        return self._register(key, variable_f.create_input(), variable_f, False)

    def add_variable_inputs(
        self, name: str | int, variable_f: NamedVariableFactories, overwrite: bool = False
    ) -> NamedTensors:
        """New graph inputs for every factory of another graph, registered under ``name``.

        This is how a graph is outlined: bind the other graph to the returned tensors.
        """
        if isinstance(name, int) and name < 0:
            raise ValueError(f"name must be a non-negative int or a string, got {name}.")
        key = str(name)
        inputs = {k: f.create_input() for k, f in variable_f.to_dict().items()}
        tensors = NamedTensors.from_dict(inputs)
        self._variable_factories.insert(key, variable_f.copy(), overwrite)
        self._named_inputs.insert(key, tensors, overwrite)
        return tensors

    # Containers -------------------------------------------------------------------------

    @classmethod
    def from_list(cls, sub_modules: Iterable[Module]) -> Module:
        """A container whose submodules are ``0``, ``1``, ... (indexable and iterable)."""
        container = cls()
        modules = list(sub_modules)
        for i, module in enumerate(modules):
            setattr(container, str(i), module)
        object.__setattr__(container, "_sub_modules", modules)
        return container

    @classmethod
    def from_variable_factories(cls, inputs: list[VariableFactory]) -> Module:
        """A container registering each factory under ``0``, ``1``, ... (use inside build)."""
        container = cls()
        for i, factory in enumerate(inputs):
            object.__setattr__(container, str(i), container.add_variable_factory(factory, str(i)))
        return container

    def get(self, key: str | int) -> Any:
        return getattr(self, str(key))

    def __getitem__(self, key: str | int) -> Any:
        return self.get(key)

    def __iter__(self) -> Iterator[Module]:
        modules = self.__dict__.get("_sub_modules")
        if modules is None:
            raise AttributeError(f"{type(self).__name__} is not a container made with from_list.")
        return iter(modules)

    # Outlined calls ---------------------------------------------------------------------

    def call_module(
        self,
        module: Module,
        name: str | None = None,
        autodiff: str = "auto",
        grads_provided: Callable[[GraphWithNamedArgs], Iterable[popxl.Tensor]] | None = None,
        grads_required: Callable[[GraphWithNamedArgs], Iterable[popxl.Tensor]] | None = None,
    ) -> _CallModule:
        """Outline ``module``: calling the result builds its graph, adds its variables under
        ``name`` (default: the class name) and calls it."""
        return _CallModule(self, module, name, autodiff, grads_provided, grads_required)

    # Custom gradients -------------------------------------------------------------------

    def create_grad_graph(
        self,
        fwd_graph: GraphWithNamedArgs,
        grads_provided: Iterable[popxl.Tensor] | None = None,
        grads_required: Iterable[popxl.Tensor] | None = None,
    ) -> GraphWithNamedArgs:
        """The gradient graph from ``build_grad``, with a GradGraphInfo like autodiff's."""
        return _build_grad_graph(self, fwd_graph, grads_provided, grads_required)


class _CallModule:
    """The callable returned by ``Module.call_module``."""

    def __init__(
        self,
        parent: Module,
        module: Module,
        name: str | None,
        autodiff: str,
        grads_provided: Any,
        grads_required: Any,
    ) -> None:
        self.parent = parent
        self.module = module
        self.name = name or type(module).__name__
        self.autodiff = autodiff
        self.grads_provided = grads_provided
        self.grads_required = grads_required
        self.var_factories: NamedVariableFactories | None = None
        self.graph: GraphWithNamedArgs | None = None
        self.n_outputs_pre_autodiff = 0

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[popxl.Tensor, ...]:
        factories, graph = self.module.create_graph(*args, **kwargs)
        self.var_factories, self.graph = factories, graph
        self.n_outputs_pre_autodiff = len(graph.graph.outputs)
        inputs = self.parent.add_variable_inputs(self.name, factories)
        self.parent.called_graphs_grad_info.map.update(graph.called_graphs_grad_info)
        wants_grad = self.autodiff in ("build_grad", "autodiff") or (
            self.autodiff == "auto" and self.module.implements_grad_graph
        )
        if wants_grad:
            method = "autodiff" if self.autodiff == "autodiff" else "build_grad"
            provided = self.grads_provided(graph) if self.grads_provided else None
            required = self.grads_required(graph) if self.grads_required else None
            grad = graph.autodiff(provided, required, method=method)
            self.parent.called_graphs_grad_info.add(graph.graph, grad.grad_graph_info)
        outputs = graph.bind(inputs).call(*tensor_arguments(self.module.build, *args, **kwargs))
        return outputs[: self.n_outputs_pre_autodiff]


def _add_forward_output(graph: popxl.Graph, t: popxl.Tensor) -> None:
    """Make an aux tensor an output of the forward graph, as the original does for every aux
    tensor (inputs such as ``x`` included), so call sites can pass it to the gradient graph."""
    add_graph_output(graph, t, inputs_too=True)


def _check_unique(label: str, tensors: list[popxl.Tensor]) -> None:
    if len(set(tensors)) != len(tensors):
        raise ValueError(f"{label} contains duplicate tensors: {tensors}")


def _check_fixed_parameters(module: Module) -> None:
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    params = inspect.signature(module.build_grad).parameters.values()
    for p in params:
        if p.kind in variadic:
            raise TypeError(BUILD_GRAD_VARIADIC_MSG.format(cls=type(module).__name__, name=p))


def _build_grad_graph(
    module: Module,
    fwd: GraphWithNamedArgs,
    grads_provided: Iterable[popxl.Tensor] | None,
    grads_required: Iterable[popxl.Tensor] | None,
) -> GraphWithNamedArgs:
    graph = fwd.graph
    provided = list(graph.outputs if grads_provided is None else grads_provided)
    required = list(graph.inputs if grads_required is None else grads_required)
    _check_unique("grads_provided", provided)
    _check_unique("grads_required", required)
    for t in provided:
        if t not in graph.outputs:
            raise ValueError(
                "A Tensor specified in `grads_provided` is not a output of `fwd_graph` "
                f"({graph.id}) or not a Tensor: {t}. Pass outputs of the forward graph."
            )
    for t in required:
        if t not in graph.inputs:
            raise ValueError(
                "A Tensor specified in `grads_required` is not a input of `fwd_graph` "
                f"({graph.id}) or not a Tensor: {t}. Pass inputs of the forward graph."
            )
    _check_fixed_parameters(module)
    variables = {t: key for key, t in fwd.args.to_dict().items()}
    aux = fwd.aux if isinstance(fwd.aux, _Aux) else _Aux()
    aux.grad_mode = True
    aux.reads = {}
    module.aux = aux
    module.var_grad = _VarGrads(module)
    module.var_grad.args = fwd.args
    module.var_grad.active = True
    _BUILDING.append(module)
    try:
        grad_graph = popxl.gir().create_graph(module.build_grad, *provided)
    finally:
        _BUILDING.pop()
        module.var_grad.active = False
    plain_required = [t for t in required if t not in variables]
    var_required = [t for t in required if t in variables]
    returned = list(grad_graph.outputs)
    if len(returned) > len(plain_required):
        raise ValueError(
            f"Too many outputs in the grad graph: build_grad returned {len(returned)}, but "
            f"`grads_required` has {len(plain_required)} non-variable inputs. If you do not want "
            "all gradients, specify `grads_required` when calling autodiff."
        )
    if len(returned) < len(plain_required):
        raise ValueError(
            "Not all forward graph inputs have been specified: build_grad returned "
            f"{len(returned)} gradients for {len(plain_required)} non-variable inputs."
        )
    missing = [variables[t] for t in var_required if variables[t] not in module.var_grad.grads]
    if missing:
        raise ValueError(
            "Not all variable gradients have been specified in self.var_grad. If you do not want "
            "all gradients, specify `grads_required` when calling autodiff. Variables missing "
            f"gradients: {missing}"
        )
    for i, (out, fwd_in) in enumerate(zip(returned, plain_required)):
        if out.shape != fwd_in.shape or out.meta_shape != fwd_in.meta_shape:
            raise ValueError(
                f"Shape or meta-shape of output Tensor at position {i} ({out.shape}) does not "
                f"match the forward input {fwd_in} it is the gradient of."
            )
    with grad_graph:
        for t in var_required:
            popxl.graph_output(module.var_grad.grads[variables[t]])
    for value in aux.store.values():
        if isinstance(value, popxl.Tensor):
            _add_forward_output(graph, value)
    fwd_tensors = [aux.store[key] for key in aux.reads]
    expected_in = [(t, ExpectedConnectionType.FwdGrad) for t in provided]
    expected_in += [(t, ExpectedConnectionType.Fwd) for t in fwd_tensors]
    expected_out = plain_required + var_required
    info = make_grad_graph_info(grad_graph, graph, expected_in, expected_out)
    module.aux = _Aux()
    module.var_grad = _VarGrads(module)
    return GraphWithNamedArgs.from_grad_graph(info)


def create_grad_graph_info(
    ir: popxl.Ir,
    fwd_graph: popxl.Graph,
    grad_graph: popxl.Graph,
    grad_input_to_fwd_output: Mapping[popxl.Tensor, popxl.Tensor],
    grad_output_to_fwd_input: Mapping[popxl.Tensor, popxl.Tensor],
    fwd_tensors: Iterable[popxl.Tensor],
) -> GradGraphInfo:
    """The ``GradGraphInfo`` of a gradient graph written by hand.

    Args:
        ir: the IR both graphs belong to.
        fwd_graph: the forward graph.
        grad_graph: the gradient graph.
        grad_input_to_fwd_output: each gradient-graph input, in input order, and the forward
            output it corresponds to.
        grad_output_to_fwd_input: each gradient-graph output, in output order, and the
            forward input it is the gradient of.
        fwd_tensors: the forward outputs whose *values* (not gradients) feed the gradient
            graph ("aux" activations): their inputs are ``Fwd`` connections, the others
            ``FwdGrad``.

    Raises:
        ValueError: a graph of another IR.
    """
    for g in (fwd_graph, grad_graph):
        if g.ir is not ir:
            raise ValueError(f"{g.id} belongs to another IR than {ir}; pass graphs of `ir`.")
    activations = set(fwd_tensors)
    expected_in = [
        (t, ExpectedConnectionType.Fwd if t in activations else ExpectedConnectionType.FwdGrad)
        for t in grad_input_to_fwd_output.values()
    ]
    expected_out = list(grad_output_to_fwd_input.values())
    return make_grad_graph_info(grad_graph, fwd_graph, expected_in, expected_out)


__all__ = [
    "Module",
    "NameScopeMeta",
    "BoundGraph",
    "GraphWithNamedArgs",
    "DotTree",
    "create_grad_graph_info",
]
