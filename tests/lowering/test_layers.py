"""The lowering layer reads one way: registry and codegen → generated code → op families → patterns → fusion.

Every import between lowering modules counts, those inside functions too (a lazy import is still a dependency):
the graph they form has no cycle.
"""

import ast
from pathlib import Path

import networkx as nx

LOWERING = Path(__file__).parents[2] / "neuron_dynamo" / "lowering"
PREFIX = "neuron_dynamo.lowering"


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == PREFIX:
                found.update(alias.name for alias in node.names)
            elif node.module.startswith(PREFIX + "."):
                found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[2] for a in node.names if a.name.startswith(PREFIX + "."))
    return found


def lowering_imports() -> nx.DiGraph:
    graph = nx.DiGraph()
    modules = {path.stem: path for path in LOWERING.glob("*.py") if path.stem != "__init__"}
    for name, path in modules.items():
        graph.add_node(name)
        for imported in _imports(path) & modules.keys():
            if imported != name:
                graph.add_edge(name, imported)
    return graph


def test_lowering_modules_import_without_cycles():
    graph = lowering_imports()
    assert list(nx.simple_cycles(graph)) == []


def test_layers_point_down():
    graph = lowering_imports()
    # the primitives know none of the op families; the families never reach up to patterns or region lowering
    for primitive in ("registry", "codegen", "generated", "creation", "int_ranges"):
        assert not nx.descendants(graph, primitive) & {"elementwise", "reduction", "views", "patterns", "fusion"}, (
            primitive, sorted(nx.descendants(graph, primitive)))
    for family in ("elementwise", "reduction", "views", "indexing", "matmul", "norm", "softmax", "loss", "distance",
                   "math_functions", "pooling"):
        assert not nx.descendants(graph, family) & {"patterns", "fusion", "artifact"}, family
