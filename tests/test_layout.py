"""The package's shape: imports run down the pipeline (no circle), no module over 600
lines, no function-local imports but of optional dependencies, and a typed public API."""
import ast
import inspect
import os

import jitgraph as jg

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jitgraph")
OPTIONAL = {"sklearn", "graphviz", "matplotlib", "torch", "ray", "threadpoolctl", "scipy", "safetensors", "tqdm"}  # imported where used (tqdm: when a training bar opens)


def modules():
    for folder, dirs, files in os.walk(PKG):
        dirs[:] = [d for d in dirs if not d.startswith((".", "__"))]
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                name = os.path.relpath(path, os.path.dirname(PKG))[:-3].replace(os.sep, ".")
                yield (name[:-9] if name.endswith(".__init__") else name), path


def internal_imports(name, path):
    """The package modules ``name`` imports at module level."""
    is_pkg = path.endswith("__init__.py")
    tree = ast.parse(open(path).read())
    known = dict(modules())
    deps = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level:
            base = name.split(".") if is_pkg else name.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
            if node.module and target in known:
                deps.add(target)
            for alias in node.names:
                if f"{target}.{alias.name}" in known:
                    deps.add(f"{target}.{alias.name}")
    return deps


def test_no_import_circle():
    graph = {name: internal_imports(name, path) for name, path in modules()}
    state = {}

    def visit(m, stack):
        state[m] = 1
        for d in graph[m]:
            assert state.get(d) != 1, "import circle: " + " -> ".join(stack[stack.index(d):] + [d])
            if not state.get(d):
                visit(d, stack + [d])
        state[m] = 2

    for m in graph:
        if not state.get(m):
            visit(m, [m])


def test_no_module_over_600_lines():
    for name, path in modules():
        with open(path) as f:
            n = sum(1 for _ in f)
        assert n < 600, f"{name} has {n} lines"


def test_function_local_imports_only_for_optional_dependencies():
    for name, path in modules():
        tree = ast.parse(open(path).read())
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, ast.Import):
                        roots = {a.name.split(".")[0] for a in node.names}
                    elif isinstance(node, ast.ImportFrom):
                        roots = {(node.module or "").split(".")[0]} if not node.level else {"<relative>"}
                    else:
                        continue
                    assert roots <= OPTIONAL, f"{name}.{fn.name} imports {roots} inside a function"


def _check_signature(obj, where):
    sig = inspect.signature(obj)
    for p in sig.parameters.values():
        if p.name in ("self", "cls"):
            continue
        assert p.annotation is not inspect.Parameter.empty, f"{where}: parameter {p.name!r} has no annotation"
    assert sig.return_annotation is not inspect.Signature.empty, f"{where}: no return annotation"


def test_public_api_is_annotated():
    for name in jg.__all__:
        obj = getattr(jg, name)
        if inspect.isfunction(obj):
            _check_signature(obj, f"jitgraph.{name}")
            assert obj.__doc__, f"jitgraph.{name} has no docstring"
        elif inspect.isclass(obj):
            assert obj.__doc__, f"jitgraph.{name} has no docstring"
            for attr, member in vars(obj).items():
                if inspect.isfunction(member) and (not attr.startswith("_") or attr == "__init__"):
                    _check_signature(member, f"jitgraph.{name}.{attr}")
    for name in ("SGD", "AdamW"):
        cls = getattr(jg.optim, name)
        for klass in cls.__mro__[:-1]:
            for attr, member in vars(klass).items():
                if inspect.isfunction(member) and (not attr.startswith("_") or attr == "__init__"):
                    _check_signature(member, f"jitgraph.optim.{klass.__name__}.{attr}")
    assert os.path.exists(os.path.join(PKG, "py.typed"))


def test_one_version_number_everywhere():
    """pip's metadata, ``jitgraph.__version__`` and the bench's records say the same: the
    project file takes its version from the package."""
    import importlib.metadata
    import tomllib
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "jitgraph.__version__"}
    assert importlib.metadata.version("jitgraph") == jg.__version__
