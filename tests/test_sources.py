"""What a declaration's output depends on (lab.sources): its own slice of its unit, the modules that slice
imports, never a registry. Checked on a small project written here."""
import textwrap

import pytest

from lab import sources

UNIT = '''
"""A unit."""
import os

from .. import helper, plots
from . import experiment, figure

LIMIT = 3


def _inputs(n):
    return list(range(min(n, LIMIT)))


@experiment()
def correctness(s):
    return [helper.check(x) for x in _inputs(s["n"])]


@figure("f", ["toy/correctness"], "Toy", caption="c")
def draw(t):
    return plots.bar(t)
'''


@pytest.fixture
def project(tmp_path, monkeypatch):
    lab = tmp_path / "workflow" / "lab"
    (lab / "units").mkdir(parents=True)
    (tmp_path / "kernels").mkdir()
    files = {lab / "__init__.py": "", lab / "units" / "__init__.py": "def experiment(): ...\n",
             lab / "helper.py": "def check(x):\n    return x\n", lab / "plots.py": "def bar(t):\n    return t\n",
             lab / "units" / "toy.py": UNIT, tmp_path / "kernels" / "__init__.py": "",
             lab / "units" / "across.py": "from .toy import LIMIT\n\n\ndef compare(t):\n    return LIMIT\n"}
    for path, text in files.items():
        path.write_text(textwrap.dedent(text))
    monkeypatch.setattr(sources, "ROOT", tmp_path)
    monkeypatch.setattr(sources, "PACKAGES", {"kernels": tmp_path / "kernels", "lab": lab})
    for cached in (sources.closure, sources._slice):
        cached.cache_clear()
    yield lab
    for cached in (sources.closure, sources._slice):
        cached.cache_clear()


def code(name):
    for cached in (sources.closure, sources._slice):
        cached.cache_clear()
    return sources.declaration_code("lab.units.toy", name)


def edit(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_an_experiment_depends_on_what_it_uses_and_not_on_its_units_figures(project):
    files, first = code("correctness")
    assert files == ["workflow/lab/__init__.py", "workflow/lab/helper.py", "workflow/lab/units/toy.py"]
    unit = project / "units" / "toy.py"
    edit(unit, "return plots.bar(t)", "return plots.bar(t)  # redrawn")  # the figure
    edit(unit, "from .. import helper, plots", "from .. import helper, os as _, plots")  # an import it does not use
    assert code("correctness")[1] == first
    edit(unit, "LIMIT = 3", "LIMIT = 4")  # a constant a helper it calls reads
    assert code("correctness")[1] != first


def test_comments_docstrings_and_blank_lines_are_not_code(project):
    """The hash reads the code, not what explains it: correcting a comment or a docstring, in the unit or
    in a module it imports, reruns nothing; a string that is not a docstring is code."""
    first = code("correctness")[1]
    unit, helper = project / "units" / "toy.py", project / "helper.py"
    edit(unit, '"""A unit."""', '"""A unit, explained at length.\n\nNow over three lines: ≥ 2 of them."""')
    edit(unit, "LIMIT = 3", "LIMIT = 3  # the largest input\n\n")
    edit(unit, "def correctness(s):\n", 'def correctness(s):\n    """Check each input."""\n')
    helper.write_text('def check(x):\n    """x, unchanged."""  # a comment\n    return x\n')
    assert code("correctness")[1] == first
    helper.write_text('def check(x):\n    "x, unchanged."\n    return x, "# not a comment"\n')
    assert code("correctness")[1] != first


def test_a_module_it_imports_counts_whole_and_a_registry_not_at_all(project):
    first, drawn = code("correctness")[1], code("draw")[1]
    (project / "units" / "__init__.py").write_text("def experiment(): ...\n_new = 1\n")
    assert (code("correctness")[1], code("draw")[1]) == (first, drawn)
    (project / "plots.py").write_text("def bar(t):\n    return None\n")  # only the figure's
    assert code("correctness")[1] == first and code("draw")[1] != drawn
    (project / "helper.py").write_text("def check(x):\n    return -x\n")
    assert code("correctness")[1] != first


def test_a_name_from_another_unit_counts_as_that_names_slice(project):
    files, first = sources.declaration_code("lab.units.across", "compare")
    assert "workflow/lab/units/toy.py" in files and "workflow/lab/helper.py" not in files
    unit = project / "units" / "toy.py"
    edit(unit, "return plots.bar(t)", "return None")  # toy's figure: not what `compare` reads
    assert code_of("across", "compare") == first
    edit(unit, "LIMIT = 3", "LIMIT = 5")
    assert code_of("across", "compare") != first


def code_of(unit, name):
    for cached in (sources.closure, sources._slice):
        cached.cache_clear()
    return sources.declaration_code(f"lab.units.{unit}", name)[1]


@pytest.mark.parametrize("old, new", [
    ('s = """a\n\nb"""\n', 's = """a\nb"""\n'),  # a blank line inside a string is its content
    ('s = """a  \nb"""\n', 's = """a\nb"""\n'),  # so are trailing blanks
    ('x = "# not a comment"\n', 'x = ""\n'),
    ('def f():\n    """doc"""; return 1\n', 'def f():\n    """doc"""; return 2\n'),
])
def test_code_only_keeps_what_is_code(old, new):
    assert sources.code_only(old) != sources.code_only(new)


def test_code_only_drops_only_explanations():
    plain = "a = 1\ndef f():\n    return 2\nb = 3"
    assert sources.code_only('"""Module."""\na = 1  # one\r\ndef f():\r\n    """Doc,\n\n    long."""\n\n    return 2\rb = 3\n') \
        == plain  # any line ending, as Python reads them
    assert sources.code_only('x = "\\d"  # an invalid escape: a warning, an error under -W error\n') == 'x = "\\d"'
