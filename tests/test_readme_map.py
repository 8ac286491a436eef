"""The README as the entry page: at most 320 lines, both set-up commands in its first 60, and its table from the
proposal to the code true to the code: every `file.py:function` it names is defined in that file and callable,
every test it names is a test function of its file, and at most two rows name no test."""

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
HEADER = ["§", "equation or rule", "computed by", "checked against an independent reference by"]
SETUP = ("python3 -m venv .venv && . .venv/bin/activate && pip install -r requirements.txt && "
         "pip install --no-deps -r requirements-no-deps.txt && ")
COMMANDS = [SETUP + "python train.py --pair qwen-llama", SETUP + 'python -m pytest -q -m "not slow" -n auto tests']
SECTIONS = {"§1.1", "§1.2", "§1.3", "§2.1", "§2.2", "§2.3"}


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def table() -> list[list[str]]:
    """The rows of the table whose header row is HEADER, each as its cells."""
    lines = README.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("|") and cells(line) == HEADER]
    assert len(starts) == 1, f"the README should hold one table with the header {HEADER}, found {len(starts)}"
    rows = []
    for line in lines[starts[0] + 2:]:           # past the header and its |---| row
        if not line.startswith("|"):
            break
        rows.append(cells(line))
    assert all(len(row) == len(HEADER) for row in rows), [row for row in rows if len(row) != len(HEADER)]
    return rows


def code(cell: str) -> str:
    found = re.fullmatch(r"`([^`]+)`", cell)
    assert found, f"{cell!r} is not one code span"
    return found.group(1)


def test_the_readme_is_short_with_both_set_up_commands_in_its_first_screen():
    lines = README.read_text().splitlines()
    assert len(lines) <= 320
    for command in COMMANDS:
        assert command in lines[:60], command


def test_every_function_the_table_names_is_defined_in_its_file_and_callable():
    rows = table()
    assert len(rows) >= 20 and SECTIONS <= {s for row in rows for s in re.findall(r"§\d\.\d", row[0])}
    for row in rows:
        path, _, name = code(row[2]).partition(":")
        assert path.endswith(".py") and (ROOT / path).is_file() and name, row[2]
        module = importlib.import_module(path[:-3].replace("/", "."))
        target = module
        for part in name.split("."):               # Class.method
            target = getattr(target, part)
        assert callable(target), row[2]
        assert target.__module__ == module.__name__, f"{row[2]}: defined in {target.__module__}, not in {path}"


def test_every_test_the_table_names_exists_and_at_most_two_rows_name_none():
    rows = table()
    tests: dict[str, set[str]] = {}
    for row in rows:
        if row[3] == "none":
            continue
        path, _, name = code(row[3]).partition("::")
        assert path.startswith("tests/") and (ROOT / path).is_file(), row[3]
        if path not in tests:
            tree = ast.parse((ROOT / path).read_text())
            tests[path] = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert name.startswith("test_") and name in tests[path], row[3]
    assert sum(row[3] == "none" for row in rows) <= 2
