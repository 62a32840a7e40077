"""Dependencies point down: an import-graph check over `src/handrail` (docs/architecture.md).

`LAYERS` is the one place the allowed direction is written: each package (or top-level module)
of `handrail`, and the packages it may import. Anything else fails here, with the file, the
line and the import.

What counts as an import: every `import` / `from ... import` anywhere in a module, at module
level or inside a function (a lazy import is still a dependency, it only happens later), and
inside `if TYPE_CHECKING:` too. A type named in a signature is knowledge of the layer it comes
from; "the tool layer must not know the manifest exists" has to hold for annotations as well.
`importlib.import_module("handrail....")` with a literal name counts the same.

A second rule: no package imports another package's private module (`handrail.x._y` from
outside `x`) or a private name (`from handrail.x import _y`). Its public `__init__` is the
contract; a private module can change without notice. The few that remain are listed in
`KNOWN_PRIVATE`, each with the reason it is tolerated; an entry that no longer happens fails
its own test, so the list only shrinks.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "handrail"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

LAYERS: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "collector": frozenset(),  # a process setting; imports nothing of ours
    "tools": frozenset({"errors"}),
    # store: policy/_whatif.py replays the record (its records, `Store.call_history`); the
    # store imports nothing of policy, so no cycle.
    "policy": frozenset({"errors", "tools", "store"}),
    "approval": frozenset({"errors", "tools", "policy"}),
    "manifest": frozenset({"errors", "tools", "policy"}),
    "models": frozenset({"errors", "tools"}),
    "store": frozenset({"errors"}),
    "otel": frozenset({"errors", "tools", "models", "store"}),
    "host": frozenset({"errors", "tools", "sandbox"}),
    "sandbox": frozenset({"errors", "tools", "policy"}),
    "builtin": frozenset({"errors", "tools", "policy", "host", "sandbox"}),
    "gate": frozenset({"errors", "tools", "policy", "approval", "models", "store", "otel"}),
    "runs": frozenset({"errors", "tools", "policy", "approval", "models", "store", "gate",
                       "manifest", "builtin", "host", "otel", "collector"}),
    "web": frozenset({"errors", "tools", "policy", "approval", "models", "store", "manifest",
                      "runs"}),
    "mcp": frozenset({"errors", "tools", "policy", "approval", "models", "store", "manifest",
                      "gate", "runs", "otel", "sandbox"}),
    "cli": frozenset({"errors", "tools", "policy", "approval", "models", "store", "manifest",
                      "builtin", "runs", "web", "mcp", "host", "sandbox", "collector"}),
}
"""Package -> the packages of ours it may import (directly; nothing is implied)."""

FACADE = "__init__"
"""`handrail/__init__.py` re-exports the public API: it may import every layer, and no layer
may import it (that would load the whole library from inside one floor)."""

KNOWN_PRIVATE: dict[tuple[str, str], str] = {
    ("approval", "handrail.policy._patterns"):
        "`compile_pattern`: the terminal approver offers \"allow for this run\" only for a "
        "target the policy's glob syntax matches literally. To be made public in "
        "`handrail.policy`",
    ("cli", "handrail.policy._whatif"):
        "`parse_since` (`7d`, `12h`, an ISO date): the CLI's `--since` takes the same values "
        "the what-if API does, with its error messages; `_paused_gc`: the command reads the "
        "record with the collector paused, as the API does",
    ("cli", "handrail.store._sqlite"):
        "`read_history`: `handrail policy what-if` reads a SQLite file on a read-only "
        "connection, without opening a store (which could fold its log: a write)",
    ("cli", "handrail.runs._program"):
        "what a program did (exit code, output head/tail, confinement) as `show` prints it; "
        "the inbox renders the same. To be made public in `handrail.runs`",
    ("web", "handrail.runs._program"):
        "the same program view as `handrail show` (see the cli entry)",
    ("host", "handrail.sandbox._sandbox"):
        "`SECCOMP_FD`, `bwrap_index`: where a wrapped argv takes the socket filter's fd; the "
        "process runner and the sandbox agree on the bwrap trampoline",
    ("host", "handrail.sandbox._landlock"):
        "`kill_descendants`: the process runner sweeps the launcher's tree before its final "
        "SIGKILL, with the sweep the launcher itself uses",
    ("approval", "handrail.policy._policy"):
        "`parse_act` (\"read\" -> Act.READ, with the policy's error message); a Request and "
        "a Decision parse acts exactly as a policy file does. To be made public or moved to "
        "`handrail.tools` next to `Act`",
    ("models", "handrail.tools._content"):
        "`render_item` (a content item as provider text); the model adapters render tool "
        "results the way the tool core defines them. To be made public in `handrail.tools`",
    ("gate", "handrail.tools._plan"):
        "`Miss` (what a plan did not cover, with the differing argument): the gate's ask "
        "carries it into the request's taint lines (issue 34). To be made public in "
        "`handrail.tools` beside `Plan`",
    ("runs", "handrail.tools._plan"):
        "the planning turn (`plan_spec`, `planning_system`, `plan_from_response`): "
        "`Agent.plan` asks the model with the plan tool of the tool core (issue 34)",
    ("gate", "handrail.tools._schemas"):
        "`compile_check`: the gate's check of a manifest-supplied schema takes the tool "
        "core's fast path for plain schemas (issue 38). To be made public in `handrail.tools`",
    ("cli", "handrail.runs._standing"):
        "`quota_standing`: `handrail show` gives a waiting call's quota count as the inbox "
        "does (issue 40). To be made public in `handrail.runs`",
    ("web", "handrail.runs._standing"):
        "the same quota standing as `handrail show` (see the cli entry)",
    ("cli", "handrail.approval._notify"):
        "`delivery_text`: `handrail show` words a delivery attempt as the inbox does "
        "(issue 41). To be made public in `handrail.approval`",
    ("web", "handrail.approval._notify"):
        "the same delivery wording as `handrail show` (see the cli entry)",
    ("runs", "handrail.approval._request"):
        "`action_from_dict`: a recorded call's actions read back as the approval request "
        "wrote them, to find the quotas a waiting call falls under (issue 40)",
}
"""(importing package, private module) -> why it is tolerated for now."""


@dataclass(frozen=True)
class Import:
    """One import of a module of ours, as found in the source."""

    file: str
    """The file, from the `handrail` folder (`handrail/gate.py`)."""
    line: int
    importer: str
    """The importing module's dotted name (`handrail.gate`)."""
    target: str
    """The module imported from (`handrail.store._records`)."""
    names: tuple[str, ...]
    """The names taken from it (`from target import a, b`); empty for `import target`."""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}"
        what = f"from {self.target} import {', '.join(self.names)}" if self.names \
            else f"import {self.target}"
        return f"{where}: {what}"


def module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    """`handrail.gate` -> `gate`, `handrail.store._sqlite` -> `store`, `handrail` -> facade."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else FACADE


def imports_in(path: Path, src: Path = SRC) -> Iterator[Import]:
    """Every import of `handrail...` in one file, wherever it stands in the file."""
    module = module_name(path, src)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    shown = str(path.relative_to(src.parent))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(shown, node.lineno, module, alias.name, ())
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            names = tuple(a.name for a in node.names)
            # `from handrail import gate` imports the module handrail.gate.
            submodules = [n for n in names if (src.parent / target.replace(".", "/") / n)
                          .with_suffix(".py").exists() or (src.parent / target.replace(".", "/")
                                                           / n / "__init__.py").exists()]
            for name in submodules:
                yield Import(shown, node.lineno, module, f"{target}.{name}", ())
            rest = tuple(n for n in names if n not in submodules)
            if rest or not names:
                yield Import(shown, node.lineno, module, target, rest)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield Import(shown, node.lineno, module, node.args[0].value, ())


def ours(imports: Iterator[Import]) -> Iterator[Import]:
    return (i for i in imports if i.target == "handrail" or i.target.startswith("handrail."))


def upward(src: Path = SRC) -> list[str]:
    """Every import that does not point down, as `file:line: import ...  (why)`."""
    found: list[str] = []
    for path in sorted(src.rglob("*.py")):
        for imp in ours(imports_in(path, src)):
            own, other = layer_of(imp.importer), layer_of(imp.target)
            if own == other or own == FACADE:
                continue
            if other == FACADE and imp.names == ("__version__",):
                continue  # defined in the facade itself, which imports nothing eagerly
            if other == FACADE:
                found.append(f"{imp}  (the facade `handrail` imports every layer; import "
                             "from the package that defines the name)")
            elif own not in LAYERS:
                found.append(f"{imp}  ({own!r} has no place in LAYERS; add it there and to "
                             "docs/architecture.md)")
            elif other not in LAYERS[own]:
                found.append(f"{imp}  ({own!r} may import only "
                             f"{', '.join(sorted(LAYERS[own])) or 'nothing of ours'})")
    return found


def private_reaches(src: Path = SRC) -> dict[tuple[str, str], list[str]]:
    """(package, private module) -> where a package uses another one's private parts."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(src.rglob("*.py")):
        for imp in ours(imports_in(path, src)):
            own, other = layer_of(imp.importer), layer_of(imp.target)
            if own == other:
                continue
            private_module = any(p.startswith("_") for p in imp.target.split(".")[2:])
            private_names = [n for n in imp.names if n.startswith("_") and n != "__version__"]
            if private_module or private_names:
                found.setdefault((own, imp.target), []).append(str(imp))
    return found


def test_dependencies_point_down() -> None:
    found = upward()
    assert not found, "imports that point up or sideways:\n" + "\n".join(found)


def test_no_package_reaches_into_another_ones_private_modules() -> None:
    found = private_reaches()
    unknown = {key: where for key, where in found.items() if key not in KNOWN_PRIVATE}
    assert not unknown, (
        "private imports across packages (use the package's public names, or make the name "
        "public; list it in KNOWN_PRIVATE only with a reason):\n"
        + "\n".join(w for where in unknown.values() for w in where)
    )


def test_every_known_private_import_still_happens() -> None:
    stale = sorted(set(KNOWN_PRIVATE) - set(private_reaches()))
    assert not stale, f"no longer imported; remove from KNOWN_PRIVATE: {stale}"


def test_the_layers_form_no_cycle() -> None:
    done: set[str] = set()

    def visit(layer: str, path: tuple[str, ...]) -> None:
        assert layer not in path, f"cycle in LAYERS: {' -> '.join((*path, layer))}"
        if layer in done:
            return
        for lower in LAYERS[layer]:
            visit(lower, (*path, layer))
        done.add(layer)

    for layer in LAYERS:
        assert LAYERS[layer] <= set(LAYERS), f"{layer} allows an unknown layer"
        visit(layer, ())


def test_every_package_has_a_layer() -> None:
    present = {p.stem if p.is_file() else p.name for p in SRC.iterdir()
               if (p.suffix == ".py" and p.name != "__init__.py")
               or (p.is_dir() and (p / "__init__.py").exists())}
    assert present == set(LAYERS)


def test_the_architecture_page_states_the_same_layers() -> None:
    """docs/architecture.md's package map and its table of allowed imports match LAYERS."""
    text = ARCHITECTURE.read_text()
    block = text.split("## Packages", 1)[1].split("```", 2)[1]
    mapped = set(re.findall(r"^  (\w+)(?:/|\.py)", block, flags=re.M))
    assert mapped == set(LAYERS), "the package map of docs/architecture.md is out of date"
    rows = text.split("| package | may import |", 1)[1].split("\n\n", 1)[0]
    table = dict(re.findall(r"^\| `(\w+)` \| (.*?) \|$", rows, flags=re.M))
    documented = {layer: frozenset(re.findall(r"`(\w+)`", allowed))
                  for layer, allowed in table.items()}
    assert documented == LAYERS, "the table of allowed imports in docs/architecture.md"


# --------------------------------------------------- the check itself finds planted bugs


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    src = tmp_path / "handrail"
    for name, body in {"__init__.py": "", **files}.items():
        path = src / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    for pkg in ("tools", "manifest", "store", "runs", "policy"):
        (src / pkg).mkdir(exist_ok=True)
        (src / pkg / "__init__.py").touch()
    return src


@pytest.mark.parametrize("body", [
    "from handrail.manifest import Manifest\n",
    "import handrail.manifest\n",
    "def f():\n    from handrail.manifest import check_against\n",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from handrail.manifest import M\n",
    "from ..manifest import Manifest\n",
    "from handrail import manifest\n",
    "import importlib\nimportlib.import_module('handrail.manifest')\n",
    "from handrail import Manifest\n",
])
def test_an_upward_import_is_found_however_it_is_spelled(tmp_path: Path, body: str) -> None:
    src = _plant(tmp_path, {"tools/_toolbox.py": body})
    found = upward(src)
    assert len(found) == 1 and "tools/_toolbox.py" in found[0], found


def test_a_downward_import_passes(tmp_path: Path) -> None:
    src = _plant(tmp_path, {"runs/_agent.py": "from handrail.gate import Gate\n"
                                              "from handrail.tools import Toolbox\n",
                            "gate.py": "from handrail.store import Store\n"})
    assert upward(src) == []


def test_a_private_module_of_another_package_is_found(tmp_path: Path) -> None:
    src = _plant(tmp_path, {
        "runs/_agent.py": "from handrail.store._base import new_owner\n"
                          "from handrail.store import _secret\n"
                          "from handrail.runs._outcome import Completed\n",  # own: fine
    })
    assert set(private_reaches(src)) == {("runs", "handrail.store._base"),
                                         ("runs", "handrail.store")}
