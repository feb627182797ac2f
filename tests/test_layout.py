"""The package's shape: one import name; kernel/ and reference/ import nothing of the rest of the project;
imports at module level never form a cycle (a cycle is how the mutants' CLI and the sweep once imported
each other). Imports inside functions are the deliberate lazy ones (the backend must be chosen before Triton
is imported) and are not counted."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PARTS = {"flashcheck": ROOT / "flashcheck", "flashcheck.kernel": ROOT / "kernel",
         "flashcheck.reference": ROOT / "reference", "flashcheck.cases": ROOT / "cases"}


def _modules():
    out = {}
    for prefix, folder in PARTS.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([prefix, *parts]) if parts else prefix
            if prefix == "flashcheck" and parts and parts[0] in ("kernel", "reference", "cases"):
                continue
            out[name] = path
    return out


def _module_level_imports(path, name, known):
    tree = ast.parse(path.read_text())
    found = set()
    for node in tree.body:
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            # "from package import submodule" depends on the submodule; "from module import name" on the module
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known]
            targets = subs if len(subs) == len(node.names) else [node.module] + subs
        for t in targets:
            if t.startswith("flashcheck") and t in known and t != name:
                found.add(t)
    return found


def test_no_import_cycles_and_kernel_reference_stand_alone():
    mods = _modules()
    graph = {name: _module_level_imports(path, name, mods) for name, path in mods.items()}
    for name, deps in graph.items():
        if name.startswith(("flashcheck.kernel", "flashcheck.reference")):
            own = "flashcheck.kernel" if name.startswith("flashcheck.kernel") else "flashcheck.reference"
            assert all(d.startswith(own) for d in deps), f"{name} imports {deps}: kernel/ and reference/ stand alone"
    state, stack = {}, []

    def visit(n):
        state[n] = "active"
        stack.append(n)
        for d in graph.get(n, ()):
            if state.get(d) == "active":
                cycle = stack[stack.index(d):] + [d]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[n] = "done"

    for n in graph:
        if n not in state:
            visit(n)
    assert len(graph) > 30, "the walk found too few modules: the layout changed under this test"
