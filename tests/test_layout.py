"""The layout the README's table describes and DESIGN.md §2 explains: the proposal's concept files and the loops
alone at the top level, support in its package folders, every file and folder in the table; no import circle among
the project's modules, the benchmark scripts included, counting every import (at module level, inside functions, for
type checking, in a demo under `if __name__ == "__main__":`); no module but a script imports a script; small files
with short module docstrings."""

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]



PACKAGES = ("baselines", "testbed", "execution", "analysis")
"""the package folders, each a flat folder of modules"""
SCRIPTS = "benchmarks"
"""the scripts' package (`python -m benchmarks.NAME`): in the import graph, not in the layout's rules for support"""


def imported(tree: ast.AST, modules: set[str]) -> set[str]:
    """The project modules (dotted names) a file imports anywhere, its demo included: `import a.b`, `from a import b`
    and `from a.b import c` all import module a.b."""
    found, todo = set(), [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        todo.extend(ast.iter_child_nodes(node))
    return found & modules


def modules(folder: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Every module of the project by its dotted name: the top level's and its package folders'."""
    files = {p.stem: p for p in folder.glob("*.py")}
    for package in packages:
        files |= {f"{package}.{p.stem}": p for p in (folder / package).glob("*.py") if p.stem != "__init__"}
    return files


def import_graph(folder: Path) -> dict[str, set[str]]:
    """Each module's project imports, the scripts' among them."""
    files = modules(folder, (*PACKAGES, SCRIPTS))
    return {name: imported(ast.parse(p.read_text()), set(files)) - {name} for name, p in files.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import circles, one per edge back into the current depth-first path (none exactly when the graph has no
    circle), each as that path's closing part."""
    found, finished, path = [], set(), []

    def walk(node: str) -> None:
        path.append(node)
        for nxt in sorted(graph[node]):
            if nxt in path:
                found.append(path[path.index(nxt):])
            elif nxt not in finished:
                walk(nxt)
        path.pop()
        finished.add(node)
    for start in sorted(graph):
        if start not in finished:
            walk(start)
    return found


def test_the_circle_finder_finds_hand_made_circles_a_demos_import_closing_one(tmp_path):
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from c import g\n")
    (tmp_path / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\n")
    (tmp_path / "d.py").write_text("import a\nif __name__ == '__main__':\n    import d2\n")
    (tmp_path / "d2.py").write_text("import d\n")
    (tmp_path / SCRIPTS).mkdir()
    (tmp_path / SCRIPTS / "s.py").write_text(f"from {SCRIPTS} import t\n")
    (tmp_path / SCRIPTS / "t.py").write_text(f"import {SCRIPTS}.s\n")
    graph = import_graph(tmp_path)
    assert graph["d"] == {"a", "d2"}
    assert sorted(sorted(c) for c in circles(graph)) == [["a", "b", "c"], [f"{SCRIPTS}.s", f"{SCRIPTS}.t"], ["d", "d2"]]


def test_no_import_circle_among_the_project_modules_demos_and_scripts_included():
    graph = import_graph(ROOT)
    assert {"train", "train_ray", "learner", "curator", "diagnosis", "testbed.policies", "execution.sandbox",
            f"{SCRIPTS}.matrix", f"{SCRIPTS}.premise"} <= set(graph)
    assert "testbed.arith" in graph["testbed.tasks"] and "execution.sandbox" in graph["testbed.verifiers"]
    assert {"testbed.policies", "testbed.arith"} <= graph["grpo"]   # a demo's imports count
    assert {f"{SCRIPTS}.power", "analysis.sets"} <= graph[f"{SCRIPTS}.matrix"]
    assert circles(graph) == []
    # a script is imported by scripts alone
    assert {(m, t) for m in graph for t in graph[m] if t.startswith(f"{SCRIPTS}.") and
            not m.startswith(f"{SCRIPTS}.")} == set()
    # nor among the packages, each taken whole: importing one module of a package runs its __init__
    packages: dict[str, set[str]] = {}
    for name, imported in graph.items():
        packages.setdefault(name.split(".")[0], set()).update(t.split(".")[0] for t in imported)
    assert circles({name: imported - {name} for name, imported in packages.items()}) == []
    # support never reaches back up into the proposal's files: only a baseline uses what it is compared within
    top = {name for name in graph if "." not in name}
    assert {(m, t) for m in graph if "." in m and not m.startswith(f"{SCRIPTS}.") for t in graph[m] & top} == {
        ("baselines.graft", "sharing"), ("baselines.hacpo", "sharing"), ("baselines.hacpo", "grpo")}


def test_the_top_level_holds_the_proposal_and_the_loops():
    top = sorted(p.stem for p in ROOT.glob("*.py"))
    assert len(top) <= 18 and {"train", "train_ray", "args", "eval", "curator", "reachability"} <= set(top)
    assert f"the {len(top)} files at the top level" in (ROOT / "README.md").read_text()
    assert not set(top) & {m.split(".")[1] for m in modules(ROOT) if "." in m}


def test_files_stay_small_and_their_docstrings_short():
    for path in modules(ROOT).values():
        text = path.read_text()
        docstring = ast.get_docstring(ast.parse(text), clean=False) or ""
        assert text.count("\n") <= 450, f"{path.name}: {text.count(chr(10))} lines, probably two ideas"
        assert docstring.count("\n") < 32, f"{path.name}: a module docstring of {docstring.count(chr(10)) + 1} lines"


def layout_table() -> dict[str, str]:
    """The README's layout table: each row's first cell (a file or folder) -> its second."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("\n## Layout\n"):]
    section = section[:section.index("\n## ", 1)]
    return dict(re.findall(r"^\| `([^`]+)` \| (.+) \|$", section, re.M))


def test_the_readme_layout_table_lists_every_file_and_folder_at_the_top_level_and_nothing_else():
    table = layout_table()
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    top = {path.split("/")[0] + ("/" if "/" in path else "") for path in tracked}
    wanted = {name for name in top if not name.startswith(".") and (name.endswith(".py") or name.endswith("/"))}
    assert set(table) == wanted, (f"in the tree, not in the table: {sorted(wanted - set(table))}; in the table, not in "
                                  f"the tree: {sorted(set(table) - wanted)}")
    for package in PACKAGES:   # and a package's row names each of its modules
        listed = set(re.findall(r"`(\w+\.py)`", table[f"{package}/"]))
        assert listed == {p.name for p in (ROOT / package).glob("*.py") if p.name != "__init__.py"}, package


def test_every_line_fits_a_screen():
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    long = [f"{path}:{n}:{len(line)}" for path in tracked if (ROOT / path).is_file()
            for n, line in enumerate((ROOT / path).read_text(encoding="utf-8").splitlines(), 1) if len(line) > 120]
    assert tracked and not long, f"{len(long)} lines over 120 characters, the first: {long[:10]}"


def defined_names(path: Path) -> set[str]:
    """Every function and class of a module, and each class's methods as Class.method."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}.{m.name}" for m in node.body if isinstance(m, ast.FunctionDef)}
    return names


def test_every_stop_of_the_readers_walk_names_a_function_its_file_defines():
    design = (ROOT / "DESIGN.md").read_text()
    walk = design[design.index("### The reader's walk"):design.index("## 4.")]
    stops = re.findall(r"`([\w/]+\.py): ([^`]+)`", walk)
    assert len(stops) >= 15, stops
    for path, listed in stops:
        defined = defined_names(ROOT / path)
        for name in (n.strip() for n in listed.split(",")):
            # a name alone is a function of the file or a method of one of its classes
            assert name in defined or any(d.endswith(f".{name}") for d in defined), f"{path} defines no {name}"
