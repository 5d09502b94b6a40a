"""No import cycles between fedcli's packages and top-level modules, nor between the federate stage and the
distributed engine: every import statement counts, function-local ones included, except those under
`if TYPE_CHECKING:` (annotations only, never executed)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fedcli"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported(module: str, path: Path) -> set[str]:
    """The fedcli modules `module` imports (a `from package import name` names the submodule when it is one)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return {name for name in found if name == "fedcli" or name.startswith("fedcli.")}


IMPORTS = {module: imported(module, path) for module, path in MODULES.items()}


def graph(unit) -> dict[str, set[str]]:
    """Edges between the units `unit` maps modules to (None: left out), self-loops dropped."""
    edges: dict[str, set[str]] = {}
    for module, targets in IMPORTS.items():
        source = unit(module)
        if source is None:
            continue
        edges.setdefault(source, set()).update(t for t in map(unit, targets) if t is not None and t != source)
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node], path[len(path):] = "open", [node]
        for target in sorted(edges.get(node, ())):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (cycle := walk(target)):
                return cycle
        state[node] = "done"
        path.pop()
        return None

    return next((cycle for node in sorted(edges) if node not in state and (cycle := walk(node))), None)


LAYERS = (  # lowest first: a module imports only from its own layer or a lower one (docs/layout.md)
    ("core",), ("experiment",), ("data",), ("models", "metrics"), ("comm",), ("training",), ("generators",),
    ("generators.stylegan2", "generators.vqvae2"), ("federate",), ("predict", "predict_scoring"), ("audit",),
    ("report",), ("pipeline",), ("cli", "cli_options", "api", "__main__"))


def layer(module: str) -> int:
    """The rank of the layer `module` belongs to (its longest matching prefix); the package root is core."""
    if module == "fedcli":
        return 0
    name = module.removeprefix("fedcli.")
    ranks = [(len(prefix), rank) for rank, prefixes in enumerate(LAYERS) for prefix in prefixes
             if name == prefix or name.startswith(prefix + ".")]
    assert ranks, f"{module} belongs to no layer: add it to LAYERS and docs/layout.md"
    return max(ranks)[1]


def reaches(edges: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """A path of imports from `start` to `goal`, or None."""
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for target in sorted(edges.get(path[-1], ())):
            if target == goal:
                return path + [goal]
            if target not in seen:
                seen.add(target)
                paths.append(path + [target])
    return None


def test_the_reader_sees_function_local_imports_and_skips_type_checking_ones():
    assert "fedcli.generators.stage" in IMPORTS["fedcli.cli"]  # imported inside the train-gan command
    assert "fedcli.generators.config" not in IMPORTS["fedcli.generators.protocol"]  # only under TYPE_CHECKING
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_every_import_points_to_the_importer_s_layer_or_a_lower_one():
    """Issue 58: the generic runtime (comm/, training/) imported the strategy registry and the VQ-VAE-2's codes,
    and train-gan imported the federate stage's engine; a kind's sub-package is above the generic generator code,
    which finds it only through the registry's discovery."""
    upward = sorted(f"{source} -> {target}" for source, targets in IMPORTS.items() for target in targets
                    if layer(target) > layer(source))
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_the_layer_rule_would_see_an_upward_import():
    assert layer("fedcli.comm.transport") < layer("fedcli.federate.strategies.fedavg")
    assert layer("fedcli.generators.registry") < layer("fedcli.generators.vqvae2.kind") \
        < layer("fedcli.federate.engine")


def test_no_cycle_between_any_two_modules():
    """Issue 58: the cycle test checked packages only, and train-gan's stage and its distributed engine imported
    each other (through a function-local import). The strategy registry's discovery, which imports every
    strategy module when the registry is first imported, counts as its imports."""
    edges = graph(lambda module: module)
    edges["fedcli.federate.strategies"] |= {m for m in MODULES if m.startswith("fedcli.federate.strategies.")}
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
