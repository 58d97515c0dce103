"""The package's layering: every import (module level or inside a function) of a jaxcap module runs from a higher
layer to a lower one or within one package, and no two modules import each other, directly or round a cycle."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Lowest first. A package may import packages of lower layers only; packages of one layer are independent.
LAYERS = [
  {
    "registry",
    "choices",
    "multihost",
    "buckets",
    "locking",
    "host_memory",
  },  # foundation
  {"fields"},  # the config schema's machinery, so that a package below the schema declares its own block
  {"sharding", "rl", "data"},
  {"models"},
  {"checkpoint"},
  {"processing"},
  {"sampling", "judges"},
  {"rewards"},
  {"world", "config"},  # the embedded synthetic world; the run config's schema (over the registries below)
  {"train"},
  {"eval"},
  {"config_files"},  # the file format of configs/*.py and their --config.x.y= overrides (ml-collections)
  {"caption_memory"},  # the annotator's memory check (jaxcap.caption's, over sampling's footprint)
  {
    "experiments",
    "launch",
    "plan",
    "caption",
    "annotation_files",
    "judge",
    "curate_qa",
    "synthesize_rubrics",
    "inspect",
  },  # programs
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
  parts = path.relative_to(root).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(root: pathlib.Path, package: str) -> dict[str, set[str]]:
  """module -> the modules of `package` it imports (the deepest module or package an import names)."""
  modules = {module_name(p, root): p for p in (root / package).rglob("*.py")}
  graph = {}
  for name, path in modules.items():
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == package:
        found.add(node.module)
        found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules)
      elif isinstance(node, ast.Import):
        found.update(a.name for a in node.names if a.name.split(".")[0] == package)
    graph[name] = {m for m in found if m in modules and m != name}
  return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components with more than one module (Tarjan), each sorted."""
  index, low, stack, on, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def _top(module: str) -> str:
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else parts[0]


def package_is_a_parent(module: str, imported: str) -> bool:
  """`import jaxcap.world.x` from inside jaxcap.world runs the package's __init__: not an edge that matters."""
  return module.startswith(imported + ".")


def test_every_package_has_a_layer():
  tops = {_top(m) for m in imports(ROOT, "jaxcap")} - {"jaxcap"}
  assert tops <= set(LAYER), f"packages with no layer in tests/test_layering.py: {sorted(tops - set(LAYER))}"


def test_imports_run_down_the_layers():
  wrong = []
  for module, targets in imports(ROOT, "jaxcap").items():
    if module == "jaxcap":
      continue
    for target in targets:
      a, b = _top(module), _top(target)
      if target != "jaxcap" and a != b and LAYER[b] >= LAYER[a]:
        wrong.append(f"{module} -> {target} (layer {LAYER[a]} imports layer {LAYER[b]})")
  assert not wrong, "imports against the layering:\n" + "\n".join(sorted(wrong))


def test_no_import_cycles():
  graph = {m: {t for t in ts if not package_is_a_parent(m, t)} for m, ts in imports(ROOT, "jaxcap").items()}
  assert not cycles(graph), f"import cycles: {cycles(graph)}"


def test_benchmarks_have_no_cycles_and_do_not_reach_into_tests():
  graph = imports(ROOT, "benchmarks")
  assert not cycles(graph), f"import cycles in benchmarks/: {cycles(graph)}"
  for path in (ROOT / "benchmarks").rglob("*.py"):
    text = path.read_text()
    assert "tests" not in {
      n.module.split(".")[0] for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ImportFrom) and n.module
    }, f"{path.name} imports from tests/"
    assert '"tests"' not in text and "'tests'" not in text, f"{path.name} puts tests/ on sys.path"


def test_the_layering_check_can_fail(tmp_path):
  pkg = tmp_path / "jaxcap"
  (pkg / "data").mkdir(parents=True)
  (pkg / "train").mkdir()
  (pkg / "__init__.py").write_text("")
  (pkg / "data" / "__init__.py").write_text("")
  (pkg / "train" / "__init__.py").write_text("")
  (pkg / "data" / "a.py").write_text("def f():\n  from jaxcap.train import b\n")
  (pkg / "train" / "b.py").write_text("from jaxcap.data import a\n")
  graph = imports(tmp_path, "jaxcap")
  assert graph["jaxcap.data.a"] == {"jaxcap.train", "jaxcap.train.b"}
  assert cycles(graph) == [["jaxcap.data.a", "jaxcap.train.b"]]
