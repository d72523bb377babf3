"""PopTorch on JAX: ``torch.nn`` models wrapped, captured and run as explicit popxl programs.

A user wraps a ``torch.nn.Module`` in ``trainingModel`` (with a ``torch.optim`` or
``poptorch.optim`` optimiser) or ``inferenceModel``; on the first call its ``forward`` is
captured with ``torch.export`` into one ordinary ``popxl.Ir`` (streams, ``repeat`` over device
iterations, gradient accumulation, replica reductions, the optimiser step) that the runtime
compiles and runs, and that you can print (``model.print_schedule()``, ``model.ir``).
``popxl_addons.Module`` models enter the same executor.

The packages, by stage: ``capture`` (torch.export, blocks, scopes, argument binding), ``aten``
(the ATen op table, a file per family), ``ops`` (PopTorch's own ops), ``options``, ``optim``,
``data``, ``execution`` (the executor and the program it builds) and ``compat`` (PopTorch's and
PopART's internals that upstream code reaches). ``import popxl`` never imports torch.
"""

from __future__ import annotations

from . import enums as enums
from . import optim as optim
from ._log import setLogLevel as setLogLevel
from .blocks import BeginBlock as BeginBlock
from .blocks import Block as Block
from .blocks import BlockFunction as BlockFunction
from .blocks import module_repr as module_repr
from .blocks import removeBlocks as removeBlocks
from .capture import scope_ops as _scope_ops  # noqa: F401 (registers push/pop_name_scope)
from .capture.arguments import ICustomArgParser as ICustomArgParser
from .capture.arguments import registerCustomArgParser as registerCustomArgParser
from .capture.scopes import Attribute as Attribute
from .capture.scopes import NameScope as NameScope
from .compat import upstream as _upstream_compat
from .compat.checkpoints import allow_script_checkpoint_classes as _allow_checkpoint_classes
from .data import AsynchronousDataAccessor as AsynchronousDataAccessor
from .data import DataLoader as DataLoader
from .enums import AutoStage as AutoStage
from .enums import CommGroupType as CommGroupType
from .enums import ConnectionType as ConnectionType
from .enums import DataLoaderMode as DataLoaderMode
from .enums import HalfFloatCastingBehavior as HalfFloatCastingBehavior
from .enums import Liveness as Liveness
from .enums import MatMulSerializationMode as MatMulSerializationMode
from .enums import MeanReductionStrategy as MeanReductionStrategy
from .enums import MultiConvPlanType as MultiConvPlanType
from .enums import OutputMode as OutputMode
from .enums import OverlapMode as OverlapMode
from .enums import ReductionType as ReductionType
from .enums import SharingStrategy as SharingStrategy
from .enums import SyncPattern as SyncPattern
from .enums import VariableRetrievalMode as VariableRetrievalMode
from .errors import Error as Error
from .errors import RecoverableError as RecoverableError
from .errors import UnrecoverableError as UnrecoverableError
from .execution.executor import PoplarExecutor as PoplarExecutor
from .execution.hooks import registerPostCompileHook as registerPostCompileHook
from .execution.hooks import registerPreCompileHook as registerPreCompileHook
from .execution.models import inferenceModel as inferenceModel
from .execution.models import load as load
from .execution.models import trainingModel as trainingModel
from .execution.program import identity_loss as identity_loss
from .ops import CPU as CPU
from .ops import MultiConv as MultiConv
from .ops import cond as cond
from .ops import ctc_beam_search_decoder as ctc_beam_search_decoder
from .ops import custom_op as custom_op
from .ops import dynamic_slice as dynamic_slice
from .ops import dynamic_update as dynamic_update
from .ops import for_loop as for_loop
from .ops import ipu_print_tensor as ipu_print_tensor
from .ops import lower_torch_op as lower_torch_op
from .ops import nop as nop
from .ops import recomputationCheckpoint as recomputationCheckpoint
from .ops import serializedMatMul as serializedMatMul
from .ops import set_available_memory as set_available_memory
from .ops import set_overlap_for_input as set_overlap_for_input
from .ops import set_overlap_for_output as set_overlap_for_output
from .options import Options as Options
from .options import TensorLocationSettings as TensorLocationSettings
from .strategies import ParallelPhasedExecution as ParallelPhasedExecution
from .strategies import Phase as Phase
from .strategies import PipelinedExecution as PipelinedExecution
from .strategies import SerialPhasedExecution as SerialPhasedExecution
from .strategies import ShardedExecution as ShardedExecution
from .strategies import Stage as Stage

poptorch_core = _upstream_compat.poptorch_core
_impl = _upstream_compat._impl
_logging = _upstream_compat._logging
_allow_checkpoint_classes()


def isRunningOnIpu() -> bool:  # noqa: N802 (PopTorch's name)
    """True while a torch model's ``forward`` is being captured for the device (so the
    model can take a device-only path), False when it runs in plain PyTorch."""
    from . import _state  # noqa: PLC0415

    return _state.TRACING.get()


def ipuHardwareIsAvailable(num_ipus: int = 1) -> bool:  # noqa: N802 (PopTorch's name)
    """False: there is no IPU hardware here; models run on JAX's devices instead."""
    return False


__all__ = [
    "AsynchronousDataAccessor",
    "Attribute",
    "AutoStage",
    "BeginBlock",
    "Block",
    "BlockFunction",
    "CommGroupType",
    "cond",
    "ConnectionType",
    "CPU",
    "ctc_beam_search_decoder",
    "custom_op",
    "DataLoader",
    "DataLoaderMode",
    "dynamic_slice",
    "dynamic_update",
    "enums",
    "Error",
    "for_loop",
    "HalfFloatCastingBehavior",
    "ICustomArgParser",
    "identity_loss",
    "inferenceModel",
    "ipu_print_tensor",
    "ipuHardwareIsAvailable",
    "isRunningOnIpu",
    "Liveness",
    "load",
    "lower_torch_op",
    "MatMulSerializationMode",
    "MeanReductionStrategy",
    "MultiConv",
    "MultiConvPlanType",
    "NameScope",
    "nop",
    "optim",
    "Options",
    "OutputMode",
    "OverlapMode",
    "ParallelPhasedExecution",
    "Phase",
    "PipelinedExecution",
    "PoplarExecutor",
    "recomputationCheckpoint",
    "RecoverableError",
    "ReductionType",
    "registerCustomArgParser",
    "registerPostCompileHook",
    "registerPreCompileHook",
    "module_repr",
    "removeBlocks",
    "serializedMatMul",
    "SerialPhasedExecution",
    "set_available_memory",
    "set_overlap_for_input",
    "set_overlap_for_output",
    "setLogLevel",
    "ShardedExecution",
    "SharingStrategy",
    "Stage",
    "SyncPattern",
    "TensorLocationSettings",
    "trainingModel",
    "UnrecoverableError",
    "VariableRetrievalMode",
]
