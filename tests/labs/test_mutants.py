"""The graders, mutation-tested (issue 25, item 5): each lab's library of wrong versions
(``dpbook.labs.lab_*.mutants``, with the labs' ``broken_*.py``) must be rejected on exactly the
expected items, with a hint that names the real cause; the references and the valid variants
must pass.

Labs D and E check every file of their library in one ``check_files`` call (one launch per N);
lab A runs ``torchrun`` once per script (about 9 s each on two cores).
"""

import pathlib

import pytest

# the folder of a lab's own broken_*.py: their docstrings are longer than a mutant's one line
LAB_DIR = "lab_a", "lab_d", "lab_e"

from dpbook.labs.lab_a import BROKEN as BROKEN_A, SOLUTION as A_SOLUTION
from dpbook.labs.lab_a import checker as checker_a
from dpbook.labs.lab_a.mutants import MUTANTS as A_MUTANTS
from dpbook.labs.lab_d import SOLUTION as D_SOLUTION
from dpbook.labs.lab_d import checker as checker_d
from dpbook.labs.lab_d.mutants import HANGING, MUTANTS as D_MUTANTS
from dpbook.labs.lab_e import SOLUTION as E_SOLUTION
from dpbook.labs.lab_e import checker as checker_e
from dpbook.labs.lab_e.mutants import MUTANTS as E_MUTANTS, VALID as E_VALID

import book_sources


def assert_caught(result, mutant):
    """✗ on exactly ``mutant.items``, and the first of them names the cause."""
    wrong = mutant.verdict(result)
    assert wrong is None, f"{wrong}\n{result}"


# Lab A's own broken scripts run in the lab's page (bai-a-ddp.ipynb), whose hidden cells hold
# them to their entries here (``MUTANTS[name].verdict``); they are not run a second time.
A_IN_PAGE = [name for name, m in A_MUTANTS.items() if m.source in BROKEN_A.values()]
A_PAGE = pathlib.Path(__file__).resolve().parents[2] / "book" / "ch04" / "p2" / "bai-a-ddp.ipynb"


def test_every_mutant_says_what_is_wrong_and_which_item_catches_it(tmp_path):
    for library in (A_MUTANTS, D_MUTANTS, E_MUTANTS):
        for name, m in library.items():
            path = m.file(tmp_path, name)  # an edit must apply to its reference exactly once
            if path.parent.name not in LAB_DIR:  # the labs' broken_*.py keep their longer text
                assert "\n" not in m.doc.strip() and len(m.doc) > 40, name  # one line
                assert path.read_text(encoding="utf-8").split('"""')[1] == m.doc
            assert path.is_file() and m.items and m.hint, name
    assert HANGING.source.is_file()


@pytest.fixture(scope="module")
def lab_d_results():
    files = [D_SOLUTION, *(m.source for m in D_MUTANTS.values())]
    results = checker_d.check_files(files, verbose=False)
    return dict(zip(["solution", *D_MUTANTS], results))


@pytest.fixture(scope="module")
def lab_e_results():
    files = [E_SOLUTION, *E_VALID.values(), *(m.source for m in E_MUTANTS.values())]
    results = checker_e.check_files(files, verbose=False)
    return dict(zip(["solution", *E_VALID, *E_MUTANTS], results))


@pytest.mark.distributed
def test_lab_d_reference_passes_at_every_n(lab_d_results):
    good = lab_d_results["solution"]
    assert good.passed and len(good.items) == 8, str(good)
    assert "N = 2, 3, 4" in good.item("ring").detail
    assert "xong sau" in good.item("overlap").detail


@pytest.mark.distributed
@pytest.mark.parametrize("name", list(D_MUTANTS))
def test_lab_d_mutant_is_caught(lab_d_results, name):
    assert_caught(lab_d_results[name], D_MUTANTS[name])


@pytest.mark.distributed
def test_lab_d_one_hanging_file_fails_alone():
    """Review G7: a file whose ring deadlocks is reported as such; the files checked with it,
    before and after, are judged as if checked alone."""
    good, hang, late = checker_d.check_files(
        [D_SOLUTION, HANGING.source, D_MUTANTS["all_at_end"].source], timeout=10, verbose=False)
    assert good.passed, str(good)
    assert_caught(hang, HANGING)
    assert_caught(late, D_MUTANTS["all_at_end"])


@pytest.mark.distributed
def test_lab_e_reference_and_valid_variants_pass(lab_e_results):
    for name in ("solution", *E_VALID):
        assert lab_e_results[name].passed, str(lab_e_results[name])
    lazy = lab_e_results["lazy_regather"].raw["fsdp"]["volume"]
    assert lazy.all_gather_backward < checker_e.expected({}, 2).volume.all_gather_backward


@pytest.mark.distributed
@pytest.mark.parametrize("name", list(E_MUTANTS))
def test_lab_e_mutant_is_caught(lab_e_results, name):
    assert_caught(lab_e_results[name], E_MUTANTS[name])


def test_lab_a_page_holds_its_broken_scripts_to_the_library():
    code = "\n".join(c.source for c in book_sources.cells(A_PAGE, "code"))
    assert sorted(A_IN_PAGE) == sorted(BROKEN_A)
    for name in A_IN_PAGE:
        assert f'checker.check(BROKEN["{name}"])' in code, name
        assert f'MUTANTS["{name}"].verdict(' in code, name


@pytest.mark.distributed
@pytest.mark.parametrize("name", [n for n in A_MUTANTS if n not in A_IN_PAGE])
def test_lab_a_mutant_is_caught(name, tmp_path):
    # The reference itself passes in the lab's page (bai-a-ddp.ipynb, hidden assert cells).
    assert A_SOLUTION.is_file()
    script = A_MUTANTS[name].file(tmp_path, name)
    assert_caught(checker_a.check(script, verbose=False), A_MUTANTS[name])
