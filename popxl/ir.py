"""``Ir``: the whole program (a main graph and its subgraphs) and its settings."""

from __future__ import annotations

import inspect
import itertools
import os
import re
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ._popart_compat import PbIr
from .graph import Graph
from .module import Module
from .replica_grouping import ReplicaGrouping
from .session_options import SessionOptions
from .tensor import Tensor, graph_input, graph_output
from .tensor_spec import TensorSpec

if TYPE_CHECKING:
    from ._op import Op
    from .remote_buffer import RemoteBuffer
    from .streams import DeviceToHostStream, HostToDeviceStream, Stream
    from .tensor import Variable

BAD_CALLABLE_MSG = "Callable `fn` must be either a function or a class that extends popxl.Module"
BAD_SIGNATURE_MSG = (
    "The arguments, `args` and `kwargs`, do not match the signature of the function `fn`: {err}"
)
MIXED_CONTAINER_MSG = (
    "A {kind} argument can't contain a mixture of Tensors and other types. Parameter "
    "'{name}' got {value!r}. Pass the tensors and the other values as separate arguments."
)
BAD_OUTPUT_MSG = (
    "Output of subgraph must be None, a Tensor or an iterable of Tensors. Got {value!r} from {fn}."
)
_BY_REF_LIST = re.compile(r"^(typing\.)?(List|Tuple|list|tuple)\[(popxl\.)?TensorByRef\]$")


class Ir:
    """A PopXL program: the main graph, the subgraphs it calls, and how it runs.

    Args:
        replication: the number of replicas the program runs on (default 1), or
            ``"popdist"`` for an instance started by ``poprun``: the replication factor is
            then the global one (all instances' replicas) and the session options
            ``globalReplicationFactor``, ``globalReplicaOffset`` and
            ``enableDistributedReplicatedGraphs`` place this instance's replicas among them.

    >>> import popxl
    >>> ir = popxl.Ir()
    >>> ir.num_host_transfers, ir.replication_factor
    (1, 1)
    """

    _ids = itertools.count()

    def __init__(self, replication: int | str = 1) -> None:
        self._id = next(Ir._ids)
        self._graphs: dict[str, Graph] = {}
        self._op_ids = itertools.count(100)
        self._graph_ids = itertools.count()
        self._dedup_ids = itertools.count()
        self._variables: list[Variable] = []
        self._streams: list[Stream] = []
        self._remote_buffers: list[RemoteBuffer] = []
        self._call_sites: dict[Graph, list[Op]] = {}
        self._num_host_transfers = 1
        self._prepared = False
        self._session_ref: Callable[[], Any] = lambda: None
        self._session_options = SessionOptions()
        self._main = Graph._create(self, "")
        self._use_popdist = replication == "popdist"
        if self._use_popdist:
            self._configure_popdist()
        else:
            self.replication_factor = cast(int, replication)  # the setter validates it

    def _configure_popdist(self) -> None:
        """Take the replication from ``poprun``'s environment (see ``popdist``)."""
        import popdist.popart

        opts = self._session_options
        popdist.popart.configureSessionOptions(opts)

    @property
    def session_options(self) -> SessionOptions:
        """The options the program is compiled and run with (PopART's ``SessionOptions``:
        ``enableStochasticRounding``, ``numIOTiles``, ``engineOptions`` ...); the object
        ``ir._pb_ir.getSessionOptions()`` returns in code written for PopXL."""
        return self._session_options

    @property
    def _pb_ir(self) -> PbIr:
        """PopART's IR handle as real PopXL code uses it (``getSessionOptions()``, ...)."""
        return PbIr(self)

    # Graphs ---------------------------------------------------------------------------

    @property
    def main_graph(self) -> Graph:
        return self._main

    def create_empty_graph(self, name: str | None = None) -> Graph:
        """A new subgraph with no inputs, outputs or ops: ``<name>_subgraph(<n>)``."""
        return self._new_subgraph(name or "graph")

    def _new_subgraph(self, base: str) -> Graph:
        return Graph._create(self, f"{base}_subgraph({next(self._graph_ids)})")

    def _graph_with_id(self, graph_id: str) -> Graph:
        """A subgraph with exactly ``graph_id`` (de-duplicated with ``_<k>`` if taken)."""
        unique = graph_id
        for k in itertools.count(1):
            if unique not in self._graphs:
                break
            unique = f"{graph_id}_{k}"
        return Graph._create(self, unique)

    def create_graph(self, fn: Callable[..., Any] | Module, *args: Any, **kwargs: Any) -> Graph:
        """Build a subgraph by calling ``fn`` with graph inputs in place of its tensor arguments.

        ``Tensor`` and ``TensorSpec`` arguments (also inside a list/tuple parameter or
        ``*args``/``**kwargs``) become graph inputs named after the parameter; parameters
        annotated ``popxl.TensorByRef`` become by-reference inputs. Other arguments are
        passed through. The returned tensor(s) become the graph outputs.

        Raises:
            TypeError: ``fn`` is not callable, or a container mixes tensors and other values.
            ValueError: the arguments do not fit ``fn``'s signature, or ``fn`` returns
                something other than None, a Tensor or Tensors.
        """
        func, qualname = _graph_function(fn)
        signature = inspect.signature(func)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as err:
            raise ValueError(BAD_SIGNATURE_MSG.format(err=err)) from None
        bound.apply_defaults()
        graph = self._new_subgraph(qualname.replace(".<locals>", ""))
        with graph:
            call_args, call_kwargs = _graph_arguments(signature, bound.arguments)
            result = func(*call_args, **call_kwargs)
            _mark_outputs(result, qualname)
        return graph

    def _call_sites_of(self, graph: Graph) -> list[Op]:
        return self._call_sites.get(graph, [])

    # Settings ---------------------------------------------------------------------------

    @property
    def num_host_transfers(self) -> int:
        """How many times each host stream is read/written per ``session.run``."""
        return self._num_host_transfers

    @num_host_transfers.setter
    def num_host_transfers(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"num_host_transfers must be a positive int, got {value!r}.")
        self._num_host_transfers = value

    @property
    def replication_factor(self) -> int:
        """Replicas of the whole program (of every instance): the session options'
        ``getGlobalReplicationFactor()``."""
        return self._session_options.getGlobalReplicationFactor()

    @replication_factor.setter
    def replication_factor(self, value: int) -> None:
        if self._prepared:
            raise RuntimeError(
                "The replication factor cannot change once a Session has been created for "
                f"{self!r}. Set it before creating the Session."
            )
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"The replication factor must be a positive int, got {value!r}.")
        if self._use_popdist:
            raise RuntimeError(
                f"The replication factor of {self!r} comes from poprun (Ir(replication="
                "'popdist')); change it with `poprun --num-replicas` instead."
            )
        opts = self._session_options
        opts.enableReplicatedGraphs = value > 1
        opts.replicatedGraphCount = value

    @property
    def instance_replication_factor(self) -> int:
        """Replicas run by this process: the session options' ``replicatedGraphCount``
        (this instance's share under popdist)."""
        return self._session_options.instance_replication_factor()

    @property
    def id(self) -> int:
        return self._id

    def replica_grouping(self, stride: int = 1, group_size: int | None = None) -> ReplicaGrouping:
        """Group replicas: group ``g`` holds ``stride``-spaced replicas, ``group_size`` of them."""
        return ReplicaGrouping._from_params(self, stride, group_size)

    def replica_grouping_from_assignments(self, assignment: list[int]) -> ReplicaGrouping:
        """Group replicas by an explicit replica → group assignment."""
        return ReplicaGrouping._from_assignment(self, assignment)

    # Streams and IO ----------------------------------------------------------------------

    def get_all_h2d_streams(self) -> set[HostToDeviceStream]:
        """Host-to-device streams that at least one ``host_load`` reads."""
        return {cast("HostToDeviceStream", s) for s in self._streams if s._is_h2d and s._used}

    def get_all_d2h_streams(self) -> set[DeviceToHostStream]:
        """Device-to-host streams that at least one ``host_store`` writes."""
        return {cast("DeviceToHostStream", s) for s in self._streams if not s._is_h2d and s._used}

    def _next_op_id(self) -> int:
        return next(self._op_ids)

    def _next_dedup(self) -> int:
        return next(self._dedup_ids)

    def _session(self) -> Any:
        return self._session_ref()

    def _attach_session(self, session: Any) -> None:
        self._session_ref = weakref.ref(session)
        self._prepared = True

    def dot_checkpoint(self, check: str, save_dir: Path | str | None = None) -> None:
        """Write the IR as a Graphviz DOT file, ``<logDir>/<check>.dot``, if ``check`` is on.

        A check is on when the session options' ``dotChecks`` or the colon-separated
        ``POPART_DOT_CHECKS`` environment variable name it (any case) or say ``ALL``. When
        neither is set, this turns every check on (``dotChecks = {"ALL"}``), so later
        checkpoints, and the ``FINAL`` one a ``Session`` writes, are on too.

        Args:
            check: the checkpoint's name.
            save_dir: sets the session options' ``logDir`` (created if missing): the folder
                of this and every later DOT file of this Ir. Default: ``logDir`` as it is
                ('' is the current folder).
        """
        from ._dot import checkpoint  # noqa: PLC0415

        opts = self._session_options
        if save_dir is not None:
            Path(save_dir).mkdir(parents=True, exist_ok=True)
            opts.logDir = str(save_dir)
        if "POPART_DOT_CHECKS" not in os.environ and not opts.dotChecks:
            opts.dotChecks = {"ALL"}
        checkpoint(self, check)

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, Ir):
            raise TypeError(f"Cannot compare a popxl.Ir with {type(other).__name__}.")
        return self._id == other._id

    def __hash__(self) -> int:
        return hash(self._id)

    def __repr__(self) -> str:
        return f"Ir[id={self._id}]"


def _graph_function(fn: Any) -> tuple[Callable[..., Any], str]:
    if isinstance(fn, Module):
        return fn.build, type(fn).__qualname__
    if callable(fn) and hasattr(fn, "__qualname__"):
        return fn, fn.__qualname__
    raise TypeError(f"{BAD_CALLABLE_MSG}. Got {fn!r}.")


def _is_template(value: Any) -> bool:
    return isinstance(value, (Tensor, TensorSpec))


def _by_ref_annotation(annotation: Any) -> tuple[bool, bool]:
    """(is TensorByRef, is List/Tuple[TensorByRef]) for a parameter annotation."""
    from .tensor import TensorByRef  # noqa: PLC0415

    if annotation is TensorByRef:
        return True, False
    if isinstance(annotation, str):
        text = annotation.replace(" ", "")
        return text.split(".")[-1] == "TensorByRef", bool(_BY_REF_LIST.match(text))
    args: tuple[Any, ...] = getattr(annotation, "__args__", None) or ()
    origin = getattr(annotation, "__origin__", None)
    is_list = origin in (list, tuple) and bool(args) and args[0] is TensorByRef
    return False, is_list


def _new_input(template: Any, name: str, by_ref: bool) -> Tensor:
    return graph_input(
        template.shape, template.dtype, name, by_ref=by_ref, meta_shape=template.meta_shape
    )


def _container_inputs(value: Any, name: str, by_ref: bool, kind: str) -> Any:
    """Graph inputs for a list/tuple/dict of templates; ``value`` itself if it holds none."""
    items = list(value.values()) if isinstance(value, dict) else list(value)
    flags = [_is_template(v) for v in items]
    if not any(flags):
        return value
    if not all(flags):
        raise TypeError(MIXED_CONTAINER_MSG.format(kind=kind, name=name, value=value))
    if isinstance(value, dict):
        return {k: _new_input(v, k, by_ref) for k, v in value.items()}
    return [_new_input(v, f"{name}_{i}", by_ref) for i, v in enumerate(items)]


def _graph_arguments(
    signature: inspect.Signature, arguments: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """Replace tensor templates by graph inputs, in signature order."""
    call_args: list[Any] = []
    call_kwargs: dict[str, Any] = {}
    for name, param in signature.parameters.items():
        value = arguments[name]
        by_ref, list_by_ref = _by_ref_annotation(param.annotation)
        kind = param.kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            call_args.extend(_container_inputs(value, name, by_ref, "tuple") if value else ())
        elif kind is inspect.Parameter.VAR_KEYWORD:
            call_kwargs.update(_container_inputs(value, name, by_ref, "dict") if value else {})
        else:
            if _is_template(value):
                new = _new_input(value, name, by_ref)
            elif isinstance(value, (list, tuple)):
                new = _container_inputs(value, name, list_by_ref, type(value).__name__)
            else:
                new = value
            if kind is inspect.Parameter.KEYWORD_ONLY:
                call_kwargs[name] = new
            else:
                call_args.append(new)
    return call_args, call_kwargs


def _mark_outputs(result: Any, fn_name: str) -> None:
    if result is None:
        return
    if isinstance(result, Tensor):
        graph_output(result)
        return
    if isinstance(result, Iterable) and not isinstance(result, (str, bytes, dict)):
        items = list(result)
        if all(isinstance(t, Tensor) for t in items):
            for t in items:
                graph_output(t)
            return
    raise ValueError(BAD_OUTPUT_MSG.format(value=result, fn=fn_name))


__all__ = ["Ir"]
