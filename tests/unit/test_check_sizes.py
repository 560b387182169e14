"""The size check of `make lint` (tests/lint/check_sizes.py) on small synthetic sources."""

import textwrap

import pytest

from tests.lint import check_sizes as cs


def function_source(name: str, body_lines: int, indent: str = "") -> str:
    """A function whose def..last line spans 1 + body_lines lines."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(body_lines))
    return f"{indent}def {name}():\n{body}"


def class_source(name: str, methods: int, method_body: int) -> str:
    """A class of `methods` methods; spans 1 + methods * (1 + method_body) lines."""
    return f"class {name}:\n" + "".join(function_source(f"m{i}", method_body, "    ") for i in range(methods))


def test_function_at_the_limit_passes_and_one_line_more_fails():
    at_limit = function_source("fits", cs.MAX_FUNCTION_LINES - 1)
    over = function_source("too_long", cs.MAX_FUNCTION_LINES)
    assert cs.offenders_in_source(at_limit, "a.py") == []
    [o] = cs.offenders_in_source(at_limit + over, "a.py")
    assert (o.kind, o.name, o.lines, o.limit) == ("function", "too_long", cs.MAX_FUNCTION_LINES + 1, 80)
    assert o.line == cs.MAX_FUNCTION_LINES + 1  # the second def starts right after the first
    assert str(o) == f"a.py:{o.line}: function too_long has 81 lines (limit 80)"


def test_async_function_and_method_are_named_by_their_qualified_name():
    source = "class Outer:\n" + function_source("step", 90, "    ").replace("def step", "async def step")
    [o] = cs.offenders_in_source(source, "pkg/m.py")
    assert (o.kind, o.name, o.line) == ("function", "Outer.step", 2)
    assert o.key == "pkg/m.py::Outer.step"


def test_nested_function_counts_on_its_own_and_in_its_parent():
    inner = function_source("inner", 85, "    ")
    source = "def outer():\n" + inner
    found = {(o.name, o.lines) for o in cs.offenders_in_source(source, "n.py")}
    assert found == {("outer", 87), ("outer.inner", 86)}


def test_def_inside_if_block_keeps_the_enclosing_prefix():
    source = "import sys\nif sys.platform:\n" + textwrap.indent(function_source("f", 81), "    ")
    [o] = cs.offenders_in_source(source, "c.py")
    assert (o.name, o.line) == ("f", 3)


def test_class_over_the_limit_is_reported_once_methods_that_fit_are_not():
    source = class_source("Big", methods=10, method_body=30)  # 1 + 10 * 31 = 311 lines
    found = cs.offenders_in_source(source, "big.py")
    assert [(o.kind, o.name, o.lines, o.line) for o in found] == [("class", "Big", 311, 1)]


def test_file_over_the_limit_is_reported_at_line_1_by_path():
    source = "".join(f"x{i} = {i}\n" for i in range(cs.MAX_FILE_LINES + 1))
    [o] = cs.offenders_in_source(source, "runtime/long.py")
    assert (o.kind, o.line, o.lines, o.key) == ("file", 1, 601, "runtime/long.py")
    assert cs.offenders_in_source(source[: source.index(f"x{cs.MAX_FILE_LINES} ")], "ok.py") == []


def test_allowlist_reads_entries_and_ignores_comments_and_blanks():
    text = "# header\n\nop/a.py   # being split\nop/b.py::C.m#being split\n"
    assert cs.read_allowlist(text) == {"op/a.py", "op/b.py::C.m"}


def test_check_excuses_allowlisted_fails_the_rest_and_reports_stale_entries():
    offenders = cs.offenders_in_source(function_source("f", 90) + function_source("g", 90), "m.py")
    failing, excused, stale = cs.check(offenders, {"m.py::f", "gone.py"})
    assert [o.name for o in failing] == ["g"]
    assert [o.name for o in excused] == ["f"]
    assert stale == ["gone.py"]


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "operator" / "pkg").mkdir(parents=True)
    (tmp_path / "runtime").mkdir()
    (tmp_path / "operator" / "pkg" / "mod.py").write_text(function_source("long_one", 100))
    (tmp_path / "runtime" / "fine.py").write_text(function_source("short", 3))
    (tmp_path / "tests").mkdir()  # outside the checked folders: never looked at
    (tmp_path / "tests" / "huge.py").write_text(function_source("ignored", 500))
    return tmp_path


def test_main_fails_with_path_and_line_then_passes_once_allowlisted(tree, capsys):
    allowlist = tree / "allow.txt"
    allowlist.write_text("")
    assert cs.main(["--root", str(tree), "--allowlist", str(allowlist)]) == 1
    out = capsys.readouterr().out
    assert "operator/pkg/mod.py:1: function long_one has 101 lines (limit 80)" in out
    assert "huge.py" not in out

    allowlist.write_text("operator/pkg/mod.py::long_one  # being split\nruntime/old.py  # being split\n")
    assert cs.main(["--root", str(tree), "--allowlist", str(allowlist)]) == 0
    out = capsys.readouterr().out
    assert "[allowlisted" in out and "stale entry" in out and "runtime/old.py" in out

