"""Imports point down only (DESIGN.md, convention 18): no module imports from a layer above
its own, the NumPy fast path is known only to the backend chooser, storage knows no networks,
and only `shoal.distributed.ray_workers` imports Ray. Every ``import`` counts, inside functions and
``TYPE_CHECKING`` blocks too."""

import ast
from pathlib import Path

import pytest

import shoal

ROOT = Path(shoal.__file__).parent

LAYERS: list[tuple[str, ...]] = [
    ("__init__", "__main__", "cli", "api", "studies"),
    ("registry",),
    ("train",),
    ("algos",),
    ("collect", "data", "distributed", "search"),
    ("fast",),
    ("nn", "losses", "optim"),
    ("envs",),
    ("config", "core"),
]
"""Top to bottom: cli/api (with the studies that drive runs: experiments, datasets,
evaluation, reports, tuning, export) -> registry -> train -> algos -> collect / data / tree
search -> the backend seam and its NumPy fast path -> nn / losses / optim -> envs -> config
and the ground floor (`shoal.core`). Parts on one line may import each other."""

RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}


def part_of(module: str) -> str:
    """``shoal.algos.policy_gradient.ppo`` -> ``algos``; ``shoal`` -> ``__init__``."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "__init__"


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


SUBMODULES = set(modules())


def imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every shoal import and every ray import in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # from shoal.fast import backend: the submodule, where there is one
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.append((node.lineno, submodule if submodule in SUBMODULES else node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
    return [(line, m) for line, m in found if m.split(".")[0] in ("shoal", "ray")]


MODULES = modules()
assert set(MODULES) == SUBMODULES


def test_every_module_belongs_to_a_layer():
    unknown = sorted({part_of(m) for m in MODULES} - set(RANK))
    assert not unknown, f"add these packages of shoal to a layer of {__name__}: {unknown}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module):
    own = part_of(module)
    wrong = []
    for line, target in imports(MODULES[module]):
        if target.split(".")[0] != "shoal":
            continue
        other = part_of(target)
        if other in RANK and RANK[other] < RANK[own]:
            wrong.append(f"line {line}: {target} ({other} is above {own})")
    assert not wrong, f"{module} imports from a layer above its own: {wrong}"


def test_only_the_backend_chooser_knows_the_fast_path():
    """Outside `shoal.fast`, code reaches the NumPy path only through its seam,
    `shoal.fast.backend` (which picks torch or NumPy)."""
    reached = {
        target
        for module, path in MODULES.items()
        for _, target in imports(path)
        if part_of(target) == "fast" and part_of(module) != "fast"
    }
    assert reached == {"shoal.fast.backend"}


def test_storage_knows_no_networks_samplers_or_learners():
    for module, path in MODULES.items():
        if part_of(module) != "data":
            continue
        for line, target in imports(path):
            assert part_of(target) not in ("nn", "losses", "collect", "algos", "fast"), (
                f"{module} line {line} imports {target}"
            )


def test_only_the_distributed_parts_import_ray():
    users = {
        module
        for module, path in MODULES.items()
        for _, target in imports(path)
        if target.split(".")[0] == "ray"
    }
    assert users == {"shoal.distributed.ray_workers"}


def test_docstrings_cite_papers_not_reference_numbers():
    """A reader cannot open "reference 003": name the paper (authors, title, year)."""
    import re

    cited = [
        f"{module}:{n}"
        for module, path in MODULES.items()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\b[Rr]eference 00\d", line)
    ]
    assert not cited, cited


def import_graph() -> dict[str, set[str]]:
    """Module -> the shoal modules it imports (anywhere in it: at the top, in functions, under
    ``TYPE_CHECKING``); ``from package import name`` counts as the submodule when ``name`` is
    one."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    targets.add(sub if sub in MODULES else node.module)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[module] = {t for t in targets if t in MODULES and t != module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, with an
    explicit stack): every set of modules that import each other, directly or around a
    circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_import_cycles_are_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": set()}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"x": {"y"}, "y": {"x"}, "z": set()}) == [["x", "y"]]


def test_no_module_imports_itself_around_a_circle():
    """Modules that import each other (even inside functions) are one module split in two:
    a reader cannot take either first, and the import order decides what works."""
    assert import_cycles(import_graph()) == []


def test_earlier_module_paths_fail_naming_the_new_one():
    """shoal 0.1's flat ``shoal.algos`` paths, and the top-level modules grouped into the
    floors' folders, no longer import: the error names where the module lives now, and an
    attribute of that name is not found."""
    import importlib

    import shoal

    with pytest.raises(ModuleNotFoundError, match="is now shoal.algos.policy_gradient.ppo"):
        importlib.import_module("shoal.algos.ppo")
    with pytest.raises(ModuleNotFoundError, match="no_such_algorithm"):
        importlib.import_module("shoal.algos.no_such_algorithm")
    with pytest.raises(ModuleNotFoundError, match="shoal.errors is now shoal.core.errors"):
        importlib.import_module("shoal.errors")
    with pytest.raises(ModuleNotFoundError, match="is now shoal.studies.plan"):
        exec("from shoal.experiment_plan import plan", {})
    with pytest.raises(AttributeError, match="no attribute 'stats'"):
        shoal.stats  # noqa: B018
    assert callable(shoal.experiment)  # the function, not the module it moved out of
