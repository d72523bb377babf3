"""A bounded, seeded sample of the differential campaign: every program must agree with the
reference. (The long campaign: ``python -m tests.differential.campaign --seconds N``.)"""

import pytest

from . import reference
from .campaign import FEATURE_SETS
from .generator import generate
from .program import count_nodes
from .runner import check, check_batch
from .shrink import describe, shrink

PROGRAMS_PER_SET = 36
BATCH = 12


def _batches(programs):
    by_replicas = {}
    for p in programs:
        by_replicas.setdefault(p.replicas, []).append(p)
    for group in by_replicas.values():
        for k in range(0, len(group), BATCH):
            yield group[k : k + BATCH]


@pytest.mark.parametrize("features", FEATURE_SETS, ids="+".join)
def test_random_programs_agree_with_the_reference(features):
    base = 10_000 * (FEATURE_SETS.index(features) + 1)
    programs = [generate(base + i, features) for i in range(PROGRAMS_PER_SET)]
    for batch in _batches(programs):
        found = check_batch(batch)
        if found:
            pytest.fail("disagreement with the reference:\n" + describe(shrink(found[0], check)))


def test_a_wrong_reference_is_caught_and_shrunk(monkeypatch):
    monkeypatch.setitem(reference.BINARY, "add", lambda xp, a, b: a + b + 1)
    programs = [generate(seed, ("call",)) for seed in range(12)]
    found = check_batch(programs)
    assert found, "a reference with a wrong `add` went unnoticed"
    small = shrink(found[0], check)
    assert count_nodes(small.program) <= count_nodes(found[0].program)
    assert count_nodes(small.program) <= 4
    text = describe(small)
    assert "= add(" in text and "Add." in text  # the generator's notation and the schedule
