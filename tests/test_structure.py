"""The repository's structural rules, checked on the source tree.

* ``device/`` never imports ``tilesim.reference``; device modules import no other public
  device module sideways (only the back end, the simulator, the lazy imports and private
  ``_``-modules).
* No function in ``reference/``, ``device/``, ``shared/`` is longer than 80 lines, apart from
  ``@pypto.frontend.jit`` kernel bodies.
* Code and docs cite public sources or the project's docs, never the team's private notes.
* ``import tilesim.tests`` fails: no folder of the checkout is a half of the package.
* No alias of a contract's names in the package; docs describe the present state (no issue
  numbers, no "now / no longer" narration), tests carry no issue numbers or dates.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tilesim.shared.dsa_attention_step import RECORD as STEP_RECORD
from tilesim.shared.dsa_attention_step import STAGES as STEPS
from tilesim.shared.registry.ops import OP_MODULES, kernel_ops

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("reference", "device", "shared")
MAX_LINES = 80
#: device modules any device module may import
DEVICE_COMMON = {"backend", "sim", "_lazy"}
#: the device modules a composite op's wrapper may import: the layer step launches its stages'
#: public wrappers one after the other (docs/ops/dsa_attention_step.md, "Kernel")
COMPOSED = {STEP_RECORD.name: {s.op for s in STEPS}}


def _py_files(*folders):
    for folder in folders:
        yield from sorted((ROOT / folder).rglob("*.py"))


def _imports(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            for alias in node.names:
                yield f"{node.module}.{alias.name}"


@pytest.mark.parametrize("path", list(_py_files("device")), ids=lambda p: p.name)
def test_device_imports_no_reference_and_no_sibling(path):
    mods = set(_imports(ast.parse(path.read_text())))
    assert not [m for m in mods if m.startswith("tilesim.reference")], mods
    if path == ROOT / "device" / "__init__.py":
        return  # the package's public face imports each wrapper by name
    own = path.stem
    siblings = {
        m.split(".")[2] for m in mods if m.startswith("tilesim.device.") and len(m.split(".")) > 2
    }
    bad = {
        s
        for s in siblings
        if s != own and s not in DEVICE_COMMON and not s.startswith("_") and s[0].isalpha()
        and (ROOT / "device" / f"{s}.py").exists()
    } - COMPOSED.get(own, set())  # fmt: skip
    assert not bad, f"{path.name} imports device modules sideways: {sorted(bad)}"


def _long_functions(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if any("jit" in ast.unparse(d) for d in node.decorator_list):
                continue
            body = [n for n in node.body if not isinstance(n, (ast.FunctionDef,))]
            jit_inner = [
                n
                for n in node.body
                if isinstance(n, ast.FunctionDef)
                and any("jit" in ast.unparse(d) for d in n.decorator_list)
            ]
            length = node.end_lineno - node.lineno + 1
            length -= sum(n.end_lineno - n.lineno + 1 for n in jit_inner)
            if length > MAX_LINES and body:
                yield f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)"


def test_no_long_functions():
    found = [f for p in _py_files(*LAYERS) for f in _long_functions(p)]
    assert not found, "\n".join(found)


_NOTE_CITATION = re.compile(r"op-facts|anchors\s*§|anchors\.md|pypto-on-cpu|team notes?\b")


def test_no_citations_of_private_team_notes():
    files = [
        p
        for p in ROOT.rglob("*")
        if p.is_file()
        and p.suffix in {".py", ".md", ".toml", ".json", ".cfg", ".txt"}
        and not any(part.startswith(".") or part in {"build", "__pycache__"} for part in p.parts)
        and p != Path(__file__).resolve()
    ]
    bad = []
    for p in files:
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if _NOTE_CITATION.search(line):
                bad.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()[:90]}")
    assert not bad, "\n".join(bad)


def test_import_tilesim_tests_fails_in_a_checkout():
    code = "import tilesim.tests"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode != 0 and "No module named 'tilesim.tests'" in res.stderr
    res = subprocess.run(
        [sys.executable, "-c", "import tilesim.reference, tilesim.shared, tilesim.cli"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr


# ----------------------------------------------------------------------------- one op, one name
#: every op of five files: its contract, golden, wrapper (+ kernel), tests and docs page share
#: this name (the registry of ops)
OPS = kernel_ops()
#: every op with a record: each has a contract module
RECORDED = OP_MODULES
#: what each op's contract module in shared/ exports: the contract and the op's record
CONTRACT = ("Args", "check_meta", "check_values", "host_plan", "cost", "RECORD")


def _top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.ImportFrom, ast.Import)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


@pytest.mark.parametrize("op", OPS)
def test_one_op_is_five_files_of_one_name(op):
    for rel in (f"shared/{op}.py", f"reference/{op}.py", f"device/{op}.py",
                f"device/_{op}_kernel.py", f"docs/ops/{op}.md"):  # fmt: skip
        assert (ROOT / rel).is_file(), f"{rel} is missing"
    for layer in ("reference", "device"):
        found = sorted((ROOT / "tests" / layer).glob(f"test_{op}*.py"))
        assert found, f"no tests/{layer}/test_{op}*.py"


@pytest.mark.parametrize("op", RECORDED)
def test_each_contract_module_exports_its_contract_and_record(op):
    names = _top_level_names(ROOT / "shared" / f"{op}.py")
    missing = [n for n in CONTRACT if n not in names]
    assert not missing, f"shared/{op}.py lacks {missing}"


@pytest.mark.parametrize("op", OPS)
def test_wrappers_hold_no_kernel_body(op):
    """The ``@pypto.frontend.jit`` builders live in ``device/_<op>_kernel.py``."""
    text = (ROOT / "device" / f"{op}.py").read_text()
    assert "frontend.jit" not in text, f"device/{op}.py defines a jit kernel"


#: names that were aliases of the contracts' names (``Args``, ``check_meta`` + ``check_values``,
#: ``FIELD_BYTES``), and the phrase that announced such re-exports
_ALIASES = re.compile(
    r"\b(DsaArgs|IndexerArgs|check_indexer|DecodeInputs|check_decode_inputs|MainBranchArgs|"
    r"_FIELDS)\b|\bformer\b"
)


def test_no_probe_smoke_or_alias_in_the_package():
    bad = []
    for p in _py_files(*LAYERS, "app"):
        rel = p.relative_to(ROOT).as_posix()
        if re.search(r"probe|smoke", p.name):
            bad.append(f"{rel}: a probe / smoke module")
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if re.search(r"\bdef \w*probe\w*\(|\btile_config\b|\bkeep_mask = ", line) or (
                _ALIASES.search(line)
            ):
                bad.append(f"{rel}:{i}: {line.strip()[:80]}")
    assert not (ROOT / "reference" / "interop.py").exists(), "reference/interop.py shim"
    assert not bad, "\n".join(bad)


def test_cache_layout_offsets_are_defined_once():
    """The packed-cache field widths and row sizes are assigned only in
    shared/layouts/mla_cache.py."""
    pat = re.compile(r"^\s*(NOPE|ROPE|NSCALES|\w*ROW_BYTES|LAYOUT_OFFSETS)\s*=", re.M)
    bad = [
        str(p.relative_to(ROOT))
        for p in _py_files(*LAYERS, "app")
        if p.name != "mla_cache.py" and pat.search(p.read_text())
    ]
    assert not bad, f"layout constants assigned outside shared/layouts/mla_cache.py: {bad}"


#: references to the issue tracker ("issue 13", "change 4"), in docs, README and tests
_TRACKER = re.compile(r"\bissue[ #]*\d|\bchange \d|\bthe issue\b", re.I)
#: a date (history lives in CHANGELOG.md and docs/perf/journal.md), in tests
_DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
#: narration of a change instead of the present state, in docs and README
_NARRATION = re.compile(
    r"\b(no longer|now|any ?more|previously|formerly|used to be|until now|this session|"
    r"aimed at|not met|(was|were|has been|have been) (renamed|removed))\b",
    re.I,
)


def _narration_hits(files, *patterns) -> list[str]:
    return [
        f"{rel}:{i}: {line.strip()[:80]}"
        for p in files
        if (rel := p.relative_to(ROOT).as_posix())
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if any(pat.search(line) for pat in patterns)
    ]


def test_docs_describe_not_narrate():
    """The docs state facts; the history lives in docs/perf/journal.md, dated, and no page
    refers to the issue tracker or narrates a change ("now", "no longer", "aimed at")."""
    docs = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
    bad = _narration_hits(docs, _TRACKER)
    journal = ROOT / "docs" / "perf" / "journal.md"
    bad += _narration_hits([p for p in docs if p != journal], _NARRATION)
    assert not bad, "\n".join(bad)
    assert journal.is_file()


def test_tests_carry_no_issue_numbers_or_dates():
    """Test headers, docstrings and comments describe what is checked; which issue asked for a
    test, and when, is history (CHANGELOG.md, docs/perf/journal.md)."""
    files = [p for p in sorted((ROOT / "tests").rglob("*.py")) if p != Path(__file__).resolve()]
    bad = _narration_hits(files, _TRACKER, _DATE)
    assert not bad, "\n".join(bad)


#: the NamedTuple API (public, though ``_``-named)
_TUPLE_API = {"_fields", "_replace", "_asdict", "_make"}


def _private_reaches(path: Path) -> list[str]:
    """Where ``path`` imports a ``_``-name of another module or reads one as an attribute."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            found += [f"{path.name}:{node.lineno}: from {node.module} import {a.name}"
                      for a in node.names if a.name.startswith("_")]  # fmt: skip
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            if not node.attr.startswith("__") and node.attr not in _TUPLE_API:
                found.append(f"{path.name}:{node.lineno}: .{node.attr}")
    return found


JUDGING = sorted(p.name for p in (ROOT / "reference" / "judging").glob("*.py"))


def test_the_judging_package_holds_the_judge():
    assert {"__init__.py", "plans.py", "stages.py", "indexer.py"} <= set(JUDGING)


@pytest.mark.parametrize("name", JUDGING)
def test_the_judges_plans_call_public_functions_only(name):
    """The judge's plans reach the goldens (the step's stages: ``step_args``, ``run_stage``)
    through their public names, never a private ``_run_*`` of another module."""
    found = _private_reaches(ROOT / "reference" / "judging" / name)
    assert not found, "\n".join(found)


def test_a_private_reach_is_found(tmp_path):
    src = tmp_path / "plan.py"
    src.write_text("from m import _run, ok\nimport m\nm._run_indexer(1)\nt._fields\nt.__doc__\n")
    assert [f.split(": ")[1] for f in _private_reaches(src)] == ["from m import _run",
                                                                 "._run_indexer"]  # fmt: skip
