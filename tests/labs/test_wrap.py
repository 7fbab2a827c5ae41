"""The wrapping exercise's checker: the solution passes every item, each wrong wrapping fails
exactly the items its mistake breaks, and the report's hint names the fix."""

import pytest

from dpbook.labs.wrap import checker, mutants, solution, starter

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def results():
    candidates = [solution.boc, starter.boc, *mutants.MUTANTS.values()]
    return dict(zip(["solution", "starter", *mutants.MUTANTS], checker.check_many(candidates)))


def test_the_solution_passes_every_item(results):
    assert results["solution"].passed and len(results["solution"].items) == len(checker.ITEMS)


def test_the_starter_fails_and_nothing_else_is_judged(results):
    r = results["starter"]
    assert r.failed == ["chay"] and not r.passed and "NotImplementedError" in str(r)


@pytest.mark.parametrize("name", sorted(mutants.MUTANTS))
def test_each_wrong_wrapping_fails_the_items_its_mistake_breaks(results, name):
    r = results[name]
    assert set(r.failed) == mutants.EXPECTED[name], str(r)
    for key in r.failed:
        assert checker.HINTS[key] in str(r)


def test_the_root_unit_alone_gathers_the_whole_model(results):
    detail = results["root_only"].items["allgather"][1]
    assert detail.startswith("1 lần AllGather cho 1 đơn vị")


def test_a_root_wrapped_first_is_explained(results):
    assert "từ dưới lên" in results["root_first"].items["chay"][1]


def test_check_refuses_what_is_not_a_function():
    with pytest.raises(TypeError, match="boc"):
        checker.check("boc")
