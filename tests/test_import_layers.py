"""The package's modules import each other one way: no circle, counting the imports made inside functions too."""

import ast
import pathlib

import keras_group_lasso

PACKAGE = pathlib.Path(keras_group_lasso.__file__).parent
NAME = "keras_group_lasso"


def _modules():
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = (NAME,) + path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(modules):
    """``{module: {module it imports}}``, the package's own modules only (the package itself left out: it only
    re-exports, on first use)."""

    def known(name):
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in modules and name != NAME else None

    edges = {}
    for module, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            found |= {known(name) for name in names if name.startswith(NAME)}
        edges[module] = found - {None, module}
    return edges


def _circles(edges):
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in edges[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = set()
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.add(other)
                if other == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in edges:
        if module not in index:
            visit(module)
    return circles


def test_the_circle_finder_finds_a_circle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(edges) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_circle():
    edges = _imports(_modules())
    assert f"{NAME}.costs.latency" in edges and f"{NAME}.analysis" in edges[f"{NAME}.costs.latency"]
    assert _circles(edges) == []


def test_the_report_does_not_import_what_sits_above_it():
    # The report, the masks and the graph come before the costs, the budget and the callbacks.
    edges = _imports(_modules())
    above = {f"{NAME}.{name}" for name in ("costs", "costs.latency", "costs.timing", "costs.table_file", "costs.units",
                                           "budget", "budget.callback", "callbacks", "surgery", "export", "models")}
    for module in (f"{NAME}.analysis", f"{NAME}.graph.masks", f"{NAME}.graph.build", f"{NAME}.graph.registry"):
        assert not edges[module] & above, module
