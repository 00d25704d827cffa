"""The mutation check's table (tests/mutants.py) stays in step with the code: each mutant still applies to exactly one
place, still parses, and names tests that exist. (Running the mutants is `python tests/mutants.py`: minutes.)"""

import ast

import pytest

from tests.mutants import MUTANTS, ROOT


@pytest.mark.parametrize("mutant", MUTANTS, ids=[mutant.name for mutant in MUTANTS])
def test_each_mutant_applies_once_parses_and_names_tests_that_exist(mutant):
    source = (ROOT / mutant.path).read_text()
    assert source.count(mutant.old) == 1, f"{mutant.path} holds {source.count(mutant.old)} copies of the line"
    ast.parse(source.replace(mutant.old, mutant.new))
    for test in mutant.tests:
        path, name = test.split("::")
        assert f"def {name.split('[')[0]}(" in (ROOT / path).read_text(), test
