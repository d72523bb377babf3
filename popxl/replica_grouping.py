"""``ReplicaGrouping``: which replicas share a variable value or take part in a collective."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .errors import InternalError

if TYPE_CHECKING:
    from .ir import Ir


def _const_assignment(replicas: int, stride: int, group_size: int) -> list[int] | None:
    """Group ``g`` starts at the first unassigned replica and takes ``group_size`` replicas
    ``stride`` apart. None if that does not partition the replicas."""
    assignment = [-1] * replicas
    group = 0
    for start in range(replicas):
        if assignment[start] != -1:
            continue
        for k in range(group_size):
            r = start + k * stride
            if r >= replicas or assignment[r] != -1:
                return None
            assignment[r] = group
        group += 1
    return assignment


def _members(assignment: list[int]) -> list[list[int]]:
    groups: dict[int, list[int]] = {}
    for replica, g in enumerate(assignment):
        groups.setdefault(g, []).append(replica)
    return [groups[g] for g in sorted(groups)]


def _constant_stride(assignment: list[int]) -> int | None:
    """The stride that generates ``assignment``, if one does."""
    members = _members(assignment)
    size = len(members[0])
    if size == 1:
        return 1
    stride = members[0][1] - members[0][0]
    if _const_assignment(len(assignment), stride, size) == assignment:
        return stride
    return None


RETRIEVAL_MODES = ("one_per_group", "all_replicas")
BAD_RETRIEVAL_MSG = (
    "Invalid retrieval_mode: {mode}. Use 'one_per_group' (the first replica of each group) "
    "or 'all_replicas'."
)


@dataclass(frozen=True)
class VariableSettings:
    """PopART's ``VariableSettings``: a grouping plus how a grouped variable is read back.

    Returned by ``ReplicaGrouping._to_variable_settings``; code written for PopXL asks it
    for the replica groups of a variable with ``groups(replication_factor)``.

    Attributes:
        stride: distance between consecutive members of a group (None for a grouping
            without a constant stride, whose groups are then given by ``assignment``).
        group_size: replicas per group.
        retrieval_mode: ``"one_per_group"`` or ``"all_replicas"``.
        assignment: the group of each replica, for the grouping this was made from.
    """

    stride: int | None
    group_size: int
    retrieval_mode: str
    assignment: tuple[int, ...]

    def groups(self, replication_factor: int) -> list[list[int]]:
        """The replicas of each group, in increasing order, for ``replication_factor``.

        Raises:
            ValueError: the stride and group size do not split ``replication_factor``
                replicas into equal groups (or, for a grouping without a constant stride,
                ``replication_factor`` is not the one it was made for).
        """
        replicas = int(replication_factor)
        if self.stride is None:
            if replicas != len(self.assignment):
                raise ValueError(
                    f"This grouping was made for {len(self.assignment)} replicas and has no "
                    f"constant stride, so it has no groups for {replicas} replicas."
                )
            return _members(list(self.assignment))
        assignment = _const_assignment(replicas, self.stride, self.group_size)
        if assignment is None or replicas % self.group_size:
            raise ValueError(
                f"stride={self.stride} and group_size={self.group_size} do not split "
                f"{replicas} replicas into equal groups."
            )
        return _members(assignment)

    def group_count(self, replication_factor: int) -> int:
        """How many groups ``replication_factor`` replicas form."""
        return len(self.groups(replication_factor))


class ReplicaGrouping:
    """A partition of the replicas into equal-sized groups.

    Made with ``ir.replica_grouping(stride, group_size)`` or
    ``ir.replica_grouping_from_assignments(assignment)``.

    >>> import popxl
    >>> ir = popxl.Ir(replication=8)
    >>> ir.replica_grouping(stride=2, group_size=4).assignment
    [0, 1, 0, 1, 0, 1, 0, 1]
    """

    _ir: Ir
    _assignment: list[int]
    _stride: int | None

    def __init__(self) -> None:
        raise RuntimeError(
            "ReplicaGrouping cannot be constructed directly. Use ir.replica_grouping(...) "
            "or ir.replica_grouping_from_assignments(...)."
        )

    @classmethod
    def _create(cls, ir: Ir, assignment: list[int], stride: int | None) -> ReplicaGrouping:
        self = object.__new__(cls)
        self._ir = ir
        self._assignment = list(assignment)
        self._stride = stride
        return self

    @classmethod
    def _from_params(
        cls, ir: Ir, stride: int = 1, group_size: int | None = None
    ) -> ReplicaGrouping:
        replicas = ir.replication_factor
        if not isinstance(stride, int) or not 0 < stride <= replicas or replicas % stride:
            raise ValueError(
                f"stride must be in (0, {replicas}] and divide the replication factor "
                f"{replicas}; got stride={stride}."
            )
        group_size = replicas // stride if group_size is None else group_size
        if not isinstance(group_size, int) or not 0 < group_size <= replicas:
            raise ValueError(
                f"group_size must be in (0, {replicas}] for replication factor {replicas}; "
                f"got group_size={group_size}."
            )
        if group_size == 1:
            stride = 1
        assignment = _const_assignment(replicas, stride, group_size)
        if assignment is None or replicas % group_size:
            raise ValueError(
                f"stride={stride} and group_size={group_size} do not split {replicas} replicas "
                "into equal groups. With stride 1 group_size must divide the replication "
                "factor; otherwise stride * group_size must fit the replicas."
            )
        return cls._create(ir, assignment, stride)

    @classmethod
    def _from_assignment(cls, ir: Ir, assignment: list[int]) -> ReplicaGrouping:
        assignment = [int(a) for a in assignment]
        replicas = ir.replication_factor
        if len(assignment) != replicas:
            raise ValueError(
                f"The assignment has {len(assignment)} entries but the replication factor is "
                f"{replicas}; give one group index per replica."
            )
        order = list(dict.fromkeys(assignment))
        if order != list(range(len(order))):
            raise ValueError(
                "Group indices must be 0, 1, ..., G-1 and appear in increasing order of first "
                f"use; got {assignment}."
            )
        sizes = {len(m) for m in _members(assignment)}
        if len(sizes) != 1:
            raise ValueError(f"All groups must have the same size; got {assignment}.")
        stride = _constant_stride(assignment)
        return cls._create(ir, assignment, stride)

    @property
    def is_const(self) -> bool:
        """True when the groups are generated by one stride."""
        return self._stride is not None

    @property
    def stride(self) -> int:
        if self._stride is None:
            raise NotImplementedError(
                f"{self!r} has no constant stride; use .assignment or .const_rg instead."
            )
        return self._stride

    @property
    def group_size(self) -> int:
        return self._assignment.count(0)

    @property
    def num_groups(self) -> int:
        return len(self._assignment) // self.group_size

    @property
    def assignment(self) -> list[int]:
        """``assignment[r]`` is the group of replica ``r``."""
        return list(self._assignment)

    @property
    def members(self) -> list[list[int]]:
        """The replicas of each group, in increasing order (a replica's rank is its index)."""
        return _members(self._assignment)

    def transpose(self) -> ReplicaGrouping:
        """The grouping whose group ``k`` holds the ``k``-th member of every group."""
        members = self.members
        new = [0] * len(self._assignment)
        for group in members:
            for rank, replica in enumerate(group):
                new[replica] = rank
        return ReplicaGrouping._from_assignment(self._ir, new)

    @property
    def const_rg(self) -> ReplicaGrouping:
        """The coarsest constant-stride grouping that refines this one (self if constant)."""
        if self.is_const:
            return self
        replicas = len(self._assignment)
        for size in range(self.group_size, 0, -1):
            for stride in range(1, replicas + 1):
                candidate = _const_assignment(replicas, stride, size)
                if candidate is not None and self._refined_by(candidate):
                    return ReplicaGrouping._create(self._ir, candidate, stride if size > 1 else 1)
        raise InternalError(f"no constant grouping refines {self}; the all-singletons one should")

    def _refined_by(self, finer: list[int]) -> bool:
        return all(len({self._assignment[r] for r in group}) == 1 for group in _members(finer))

    @property
    def to_device_map(self) -> list[int] | None:
        """For a non-constant grouping: the original group of each ``const_rg`` group."""
        if self.is_const:
            return None
        return [self._assignment[group[0]] for group in self.const_rg.members]

    @property
    def to_host_map(self) -> list[int] | None:
        """For a non-constant grouping: the first ``const_rg`` group of each original group."""
        device_map = self.to_device_map
        if device_map is None:
            return None
        return [device_map.index(g) for g in range(self.num_groups)]

    def _to_variable_settings(
        self, retrieval_mode: Literal["one_per_group", "all_replicas"] | None = None
    ) -> VariableSettings:
        """This grouping as PopART's ``VariableSettings`` (see :class:`VariableSettings`).

        Args:
            retrieval_mode: ``"one_per_group"`` (the default) or ``"all_replicas"``.

        Raises:
            ValueError: any other ``retrieval_mode``.
        """
        mode = "one_per_group" if retrieval_mode is None else retrieval_mode
        if mode not in RETRIEVAL_MODES:
            raise ValueError(BAD_RETRIEVAL_MSG.format(mode=retrieval_mode))
        return VariableSettings(self._stride, self.group_size, mode, tuple(self._assignment))

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, ReplicaGrouping):
            raise TypeError(f"Cannot compare a ReplicaGrouping with {type(other).__name__}.")
        return self._ir is other._ir and self._assignment == other._assignment

    def __hash__(self) -> int:
        return hash((self._ir.id, tuple(self._assignment)))

    def __repr__(self) -> str:
        if self.is_const:
            return (
                f"ReplicaGrouping(num_replicas={len(self._assignment)}, stride={self._stride}, "
                f"group_size={self.group_size}, num_groups={self.num_groups})"
            )
        return f"ReplicaGrouping(assignment={self._assignment})"


__all__ = ["ReplicaGrouping", "VariableSettings"]
