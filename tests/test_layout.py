"""The layout holds: no import cycle among the project's modules (imports inside functions
count), each room imports only what its docstring allows, the protocol layer loads no model
runtime, and ``pool/`` stays small at its root. Read from the source (``ast``), so a test fails
on the import that broke the rule, whether or not it runs."""

import ast
import subprocess
import sys

import pytest

from .helpers import PROJECT_DIR

APPS = ("pool", "realtime", "s2s_project")
RUNTIMES = ("onnxruntime", "ctranslate2", "torch", "xllamacpp", "kokoro_onnx", "faster_whisper")

# room -> (what it may not import, the exceptions): a prefix covers its submodules. Each room's
# docstring says the same in words.
RULES = {
    "pool": (("realtime",), ("realtime.audio", "pool.management.commands.runpool")),
    "pool.pipeline": (("realtime", "pool.models", "pool.access", "pool.history", "pool.admin", "django.db"), ()),
    "pool.backends": (("realtime", "pool.models", "pool.pipeline", "pool.access", "pool.history", "django.db"), ()),
    "pool.access": (("realtime",), ()),
    "pool.history": (("realtime", "pool.access"), ("realtime.audio",)),
    "realtime.session": (("realtime.consumers", "realtime.views", "realtime.client_secrets", "pool.models",
                          "channels"), ()),
}
POOL_ROOMS = ("pool.pipeline", "pool.backends", "pool.access", "pool.history")
ROOT_FOR_ROOMS = ("pool.conf", "pool.states", "pool.ids", "pool.metrics", "pool.models")


def within(name, prefixes):
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def modules():
    """Dotted name -> path of every module of the apps (migrations left out: Django writes them)."""
    found = {}
    for app in APPS:
        for path in sorted((PROJECT_DIR / app).rglob("*.py")):
            parts = path.relative_to(PROJECT_DIR).with_suffix("").parts
            if "migrations" in parts:
                continue
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(name, path, known):
    """The project modules ``name`` imports anywhere in its file (functions included): for
    ``from a import b``, ``a.b`` when that is a module, else ``a``."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[:len(package) - node.level + 1]
                base = ".".join(package + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        found.update(targets)
    return found - {name}


@pytest.fixture(scope="module")
def graph():
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(graph):
    """Every import cycle among the project's modules, each as the list of its modules."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in graph:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_among_the_projects_modules(graph):
    assert cycles(graph) == []


@pytest.mark.parametrize("room", sorted(RULES))
def test_each_room_imports_only_what_it_may(graph, room):
    forbidden, allowed = RULES[room]
    broken = sorted(f"{name} imports {target}" for name, targets in graph.items()
                    if within(name, (room,)) and not within(name, allowed)
                    for target in targets if within(target, forbidden) and not within(target, allowed))
    assert broken == []


def test_the_pools_rooms_import_only_the_settings_states_ids_metrics_and_models_of_its_root(graph):
    root = {name for name in graph if name.count(".") == 1 and name.startswith("pool.")
            and name not in POOL_ROOMS}
    broken = sorted(f"{name} imports {target}" for name, targets in graph.items() if within(name, POOL_ROOMS)
                    for target in targets if target in root - set(ROOT_FOR_ROOMS))
    assert broken == []


def test_imports_inside_functions_and_relative_imports_are_seen(tmp_path):
    module = tmp_path / "stages.py"
    module.write_text("from . import base\n\ndef load():\n    from pool.models import Unit\n")
    known = {"pool.pipeline.base", "pool.models"}
    assert imports("pool.pipeline.stages", module, known) == {"pool.pipeline.base", "pool.models"}


def test_each_room_says_what_it_holds_and_what_it_may_import():
    rooms = [path for app in ("pool", "realtime") for path in (PROJECT_DIR / app).rglob("__init__.py")
             if not {"migrations", "management", "commands"} & set(path.parts)]
    assert len(rooms) >= 8
    for path in rooms:
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert len(doc) > 100 and "import" in doc, path


def test_pool_has_at_most_16_modules_at_its_root():
    assert len(list((PROJECT_DIR / "pool").glob("*.py"))) <= 16


def test_the_protocol_layer_loads_no_model_runtime():
    probe = (
        "import sys, django; django.setup(); "
        "import realtime.session_config, realtime.events, realtime.audio, realtime.errors, realtime.session; "
        f"print(sorted(m for m in {RUNTIMES!r} if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", probe], cwd=PROJECT_DIR, capture_output=True, text=True,
                         env={"DJANGO_SETTINGS_MODULE": "s2s_project.settings", "PATH": "/usr/bin:/bin"},
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def codes_in_the_source():
    """Every error code the apps can send, as written where it is raised or built: the first
    argument of ProtocolError, Refusal, InputRejected and AudioFormatError, and ``"code": ...``
    and ``code=...`` literals."""
    import re

    pattern = re.compile(r"""(?:ProtocolError|Refusal|InputRejected|AudioFormatError)\(\s*(?:f?"[^"]*",\s*)?"([a-z0-9_]+)"|"""
                         r"""(?:"code":\s*|\bcode=)"([a-z0-9_]+)\"""")
    found = set()
    for app in ("pool", "realtime"):
        for path in (PROJECT_DIR / app).rglob("*.py"):
            for match in pattern.finditer(path.read_text()):
                found.add(match.group(1) or match.group(2))
    return found


def test_the_readme_names_every_error_code_the_server_sends():
    readme = (PROJECT_DIR / "README.md").read_text()
    table = readme[readme.index("### Errors"):readme.index("### Function calling")]
    codes = codes_in_the_source()
    assert {"invalid_json", "server_error", "session_limit_reached", "invalid_base64"} <= codes  # the scan works
    assert sorted(code for code in codes if f"`{code}`" not in table) == []


def test_the_readmes_layout_names_every_module_and_room_of_the_apps():
    readme = (PROJECT_DIR / "README.md").read_text()
    layout = readme[readme.index("## Layout"):]
    missing = []
    for app in ("pool", "realtime"):
        for path in sorted((PROJECT_DIR / app).iterdir()):
            if path.suffix == ".py" and path.name != "__init__.py" and f"`{path.name}`" not in layout:
                missing.append(f"{app}/{path.name}")
            elif path.is_dir() and (path / "__init__.py").exists() and f"`{path.name}/" not in layout:
                missing.append(f"{app}/{path.name}/")
    assert missing == []
