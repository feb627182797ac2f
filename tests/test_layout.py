"""The package's shape: one import name; kernel/ and reference/ import nothing of the rest of the project; no import
cycle, counting every import (module level or inside a function: a cycle through a lazy import is still a cycle,
and tools that read imports see them all); and every import of the project, of torch or of Triton made inside a
function says why it is lazy (the backend must be chosen before Triton; `import flashcheck` and the pytest plugin
must not import torch)."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PARTS = {"flashcheck": ROOT / "flashcheck", "flashcheck.kernel": ROOT / "kernel",
         "flashcheck.reference": ROOT / "reference", "flashcheck.cases": ROOT / "cases"}
HEAVY = ("flashcheck", "torch", "triton")


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


def _imports(path, name, known):
    """{(imported module, lineno, at module level)} of one file: every import statement, wherever it stands."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    for n in tree.body:                      # a top-level try/if (optional imports) counts as module level
        if isinstance(n, (ast.Try, ast.If)):
            top.update(id(m) for m in ast.walk(n))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            # "from package import submodule" depends on the submodule; "from module import name" on the module
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known]
            targets = subs if len(subs) == len(node.names) else [node.module] + subs
        else:
            continue
        for t in targets:
            if t != name:
                found.add((t, node.lineno, id(node) in top))
    return found


def test_no_import_cycles_and_kernel_reference_stand_alone():
    mods = _modules()
    graph = {name: {t for t, _, _ in _imports(path, name, mods) if t in mods} for name, path in mods.items()}
    for name, deps in graph.items():
        if name.startswith(("flashcheck.kernel", "flashcheck.reference")):
            own = "flashcheck.kernel" if name.startswith("flashcheck.kernel") else "flashcheck.reference"
            assert all(d.startswith(own) for d in deps), f"{name} imports {deps}: kernel/ and reference/ stand alone"
    state, stack = {}, []

    def visit(n):
        state[n] = "active"
        stack.append(n)
        for d in sorted(graph.get(n, ())):
            if state.get(d) == "active":
                cycle = stack[stack.index(d):] + [d]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[n] = "done"

    for n in sorted(graph):
        if n not in state:
            visit(n)
    assert len(graph) > 30, "the walk found too few modules: the layout changed under this test"
    assert sum(len(d) for d in graph.values()) > 100, "the walk found too few imports: it no longer reads them all"


def test_every_lazy_import_says_why():
    mods = _modules()
    silent = []
    for name, path in mods.items():
        lines = path.read_text().splitlines()
        for target, lineno, at_top in _imports(path, name, mods):
            if at_top or not target.split(".")[0] in HEAVY:
                continue
            # the import's own line and the block of imports and comments it stands in, up to the line before it
            i = lineno - 1
            while i > 0 and lines[i - 1].strip().startswith(("import ", "from ", "#", ")")) or (
                    i > 0 and not lines[i - 1].strip()):
                i -= 1
            said = " ".join(lines[i:lineno])
            if "lazy" not in said and "imported after" not in said:
                silent.append(f"{path.relative_to(ROOT)}:{lineno} imports {target} inside a function without saying why")
    assert not silent, "\n".join(silent)
