"""The registry of op records is the one list of ops: every consumer derives its list from it.

* each record is its contract module's ``RECORD``: its calls exist in ``tilesim.reference``
  (and ``tilesim.device`` where it says so), its ``cost`` is the module's;
* the consumers (the judge's kinds and plans, the case families and case modules, the lazy
  names of ``tilesim.reference`` and ``tilesim.device``, the structural test, the digests, the
  CLI) agree with the registry;
* no consumer keeps a list of its own: no module-level literal in a consumer names two ops,
  calls or families (a family's case module may key a table of per-op data by exactly the
  calls its cases make); no file is excepted;
* the golden and the device wrapper of a call write their signature out, beginning with the
  record's input prototypes (the one source, held equal here); the sim tests read their pass
  figures from the records' ``budgets`` and write none of their own.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pydoc
import sys
import textwrap
from pathlib import Path

import pytest
from tilesim.shared.registry import ops
from tilesim.shared.registry.op_record import OpRecord
from tilesim.shared.tiling import SaTileShapeConfig

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ops.records()
CALLS = ops.calls()


def _module(name: str):
    return importlib.import_module(name)


# ----------------------------------------------------------------------------- the records
@pytest.mark.parametrize("rec", RECORDS, ids=lambda r: r.name)
def test_each_record_is_its_contract_modules(rec):
    mod = _module(f"tilesim.shared.{rec.name}")
    assert isinstance(rec, OpRecord) and mod.RECORD is rec
    assert rec.cost is mod.cost
    assert (ROOT / "shared" / f"{rec.name}.py").is_file()
    assert (ROOT / "reference" / f"{rec.name}.py").is_file()
    assert (ROOT / "docs" / "ops" / f"{rec.name}.md").is_file()
    assert rec.family in ops.families()


def test_call_and_public_names_are_unique():
    names = [c.name for c in CALLS]
    assert len(names) == len(set(names)), names
    extra = [n for r in RECORDS for n in r.names]
    assert not set(extra) & set(names)
    assert len(extra) == len(set(extra)), extra


@pytest.mark.parametrize("call", CALLS, ids=lambda c: c.name)
def test_each_call_is_a_public_golden(call):
    import tilesim.reference as ref

    fn = getattr(ref, call.name)
    assert fn.__module__ == f"tilesim.reference.{call.module}"


def _wrappers(call) -> list[object]:
    """The published golden and, if any, the device wrapper of ``call``."""
    import tilesim.device as dev
    import tilesim.reference as ref

    return [getattr(ref, call.name), *([getattr(dev, call.name)] if call.device else [])]


def _params(sig: inspect.Signature) -> list[tuple]:
    return [(p.name, p.kind, p.default, p.annotation) for p in sig.parameters.values()]


def _signature(fn) -> inspect.Signature:
    """``fn``'s signature with its annotations evaluated (a module may defer them or not)."""
    return inspect.signature(fn, eval_str=True)


def _prototype_params(call) -> list[tuple]:
    return [t for proto in call.signature for t in _params(_signature(proto))]


@pytest.mark.parametrize("call", [c for c in CALLS if c.device], ids=lambda c: c.name)
def test_each_kernel_call_has_its_prototypes(call):
    """A call the device exports has its inputs written once, in its contract module."""
    rec = ops.record_of_call(call.name)
    assert call.signature, f"{call.name}: no input prototypes in its record"
    for proto in call.signature:
        assert proto.__module__ == f"tilesim.shared.{rec.name}", proto
        assert getattr(_module(proto.__module__), proto.__name__) is proto


@pytest.mark.parametrize("call", [c for c in CALLS if c.signature], ids=lambda c: c.name)
def test_golden_and_wrapper_write_out_the_prototypes_signature(call):
    """The golden and the device wrapper write their signature out in Python (what
    ``help()``, a type checker and an editor read: no ``__signature__`` laid over ``*args``),
    and it begins with the record's input prototypes exactly: names, kinds, defaults (the
    model constants of :mod:`tilesim.shared.models`) and annotations. The prototypes are the
    one source; each layer's own keywords (``trace``; ``backend``, ``soc``, ``validate``)
    follow them."""
    protos = _prototype_params(call)
    for fn in _wrappers(call):
        inner = inspect.unwrap(fn)  # a functools.wraps decorator (quiet_numpy) keeps its def
        assert "__signature__" not in vars(fn) and "__signature__" not in vars(inner), fn
        assert not inner.__code__.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS), fn
        assert _params(_signature(fn))[: len(protos)] == protos, fn.__module__
        assert fn.__doc__ and fn.__name__ == call.name, fn
        shown = pydoc.render_doc(fn, renderer=pydoc.plaintext)  # what help(fn) prints
        assert f"{call.name}({protos[0][0]}, " in shown and fn.__doc__.split()[0] in shown


def _literal_sizes(fn) -> list[str]:
    """The parameters of ``fn`` whose default is written as an integer literal above 1 (a
    size such as ``topk=2048``, which belongs in :mod:`tilesim.shared.models`)."""
    node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    args = node.args
    positional = zip(args.args[::-1], args.defaults[::-1], strict=False)  # defaults: the last
    pairs = [*positional, *zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    return [a.arg for a, d in pairs if isinstance(d, ast.Constant) and type(d.value) is int
            and d.value > 1]  # fmt: skip


@pytest.mark.parametrize("call", [c for c in CALLS if c.signature], ids=lambda c: c.name)
def test_the_prototypes_take_sizes_from_the_model_constants(call):
    for proto in call.signature:
        assert not _literal_sizes(proto), (proto.__qualname__, _literal_sizes(proto))


def test_the_signature_check_can_fail():
    """A signature that drops a prototype's default or renames a parameter is caught."""
    from tilesim.shared.dsa import model_keywords

    def written(*, nq: int = 64, n_kv: int = 1, softmax_scale: float, topk: int = 2048,
                block_size: int = 128, tiling: SaTileShapeConfig | None = None):  # fmt: skip
        """A wrapper's keywords with one default off."""

    assert _literal_sizes(written) == ["nq", "topk", "block_size"]
    assert not _literal_sizes(model_keywords)
    protos = _params(_signature(model_keywords))
    assert _params(_signature(written)) != protos
    assert [p[:2] + p[3:] for p in _params(_signature(written))] == [p[:2] + p[3:] for p in protos]


@pytest.mark.parametrize("call", CALLS, ids=lambda c: c.name)
def test_each_call_names_its_outputs_once(call):
    assert call.outputs and len(set(call.output_names)) == len(call.outputs)


def test_every_reference_name_resolves():
    import tilesim.reference as ref

    for name, module in ops.reference_names().items():
        obj = getattr(_module(f"tilesim.reference.{module}"), name)
        assert getattr(ref, name) is obj


def _is_constant(node: ast.expr) -> bool:
    """A literal expression (numbers, ``2.0**-16``, a dict or tuple of them)."""
    try:
        eval(compile(ast.Expression(node), "<budget>", "eval"), {"__builtins__": {}})
    except Exception:  # noqa: BLE001 -- a name, a call: not a literal
        return False
    return True


def _own_budgets(path: Path) -> list[str]:
    """The module-level names of ``path`` that hold pass figures of their own: any
    ``BUDGET`` / ``BUDGET_*``, and any name with ``BUDGET`` in it bound to a literal."""
    found = []
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for t in targets:
            name = getattr(t, "id", "")
            own = name == "BUDGET" or name.startswith("BUDGET_")
            if own or ("BUDGET" in name and _is_constant(node.value)):
                found.append(f"{path.name}:{node.lineno}: {name}")
    return found


def _reads_budgets(path: Path, op: str) -> bool:
    """``path`` reads ``record("<op>").budgets`` (:func:`tilesim.shared.registry.ops.record`)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "budgets":
            call = node.value
            if (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "record"
                    and [getattr(a, "value", None) for a in call.args] == [op]):  # fmt: skip
                return True
    return False


DEVICE_TESTS = sorted((ROOT / "tests" / "device").glob("*.py"))


@pytest.mark.parametrize("path", DEVICE_TESTS, ids=lambda p: p.name)
def test_no_device_test_keeps_its_own_budgets(path):
    """The pass figures are the records' ``budgets``: no device test writes them again."""
    found = _own_budgets(path)
    assert not found, "\n".join(found)


@pytest.mark.parametrize("rec", [r for r in RECORDS if r.budgets], ids=lambda r: r.name)
def test_each_ops_sim_test_reads_its_records_budgets(rec):
    assert _reads_budgets(ROOT / "tests" / "device" / f"test_{rec.name}_sim.py", rec.name)


def test_the_budget_checks_can_fail(tmp_path):
    own = tmp_path / "own.py"
    own.write_text('BUDGET_ROW_ULP = 1.0\nBUDGET = {"fp32": 2.0**-16}\nMY_BUDGETS = (0.99, 1)\n'
                   'BUDGETS = record("moe").budgets\n')  # fmt: skip
    assert [f.split(": ")[1] for f in _own_budgets(own)] == ["BUDGET_ROW_ULP", "BUDGET",
                                                             "MY_BUDGETS"]  # fmt: skip
    assert _reads_budgets(own, "moe") and not _reads_budgets(own, "msa_decode")


# ----------------------------------------------------------------------------- the consumers
def test_the_judge_reads_the_registry():
    judge = _module("tilesim.reference.judging")
    plans = _module("tilesim.reference.judging.plans")
    stages = _module("tilesim.reference.judging.stages")
    assert judge.JUDGE_KINDS == {**ops.judge_kinds(), "float": ("float", None),
                                "ids": ("ids", None)}  # fmt: skip
    assert plans.OP_KINDS == ops.golden_kinds()
    assert plans.LIGHTNING_INDEXER_OPS == ops.calls_judged_by("indexer")
    assert plans.OPTIONAL_OUTPUTS == ops.optional_outputs()
    assert sorted(stages.STAGED_OPS) == sorted(ops.calls_judged_by("stages"))
    for call in CALLS:
        assert call.judge_kind is None or call.judge_kind in judge.JUDGE_KINDS


def test_the_case_registry_reads_the_registry():
    from tilesim.cli import registry
    from tilesim.shared.registry.case_schema import CASE_FAMILIES

    assert CASE_FAMILIES == ops.families()
    assert registry.FAMILIES == ops.families()
    msa = _module("tilesim.reference.cases.msa")
    dsi = _module("tilesim.reference.cases.dsa_indexer")
    assert msa._OPS == ops.golden_calls("msa")
    assert dsi.OPS == ops.golden_calls("dsa_indexer")
    golden = set(ops.golden_calls())
    for info in registry.load_registry().values():
        assert info.op in golden, info.name
        assert ops.record_of_call(info.op).family == info.family, info.name


def test_every_family_has_a_builder():
    for family in ops.families():
        module, builder = ops.case_builder(family)
        assert callable(getattr(_module(module), builder))


def test_the_packages_export_the_registrys_names():
    """``tilesim.reference`` and ``tilesim.device`` import each public name by name; the
    names they export beyond their own few are exactly the registry's."""
    import tilesim.device as dev
    import tilesim.reference as ref

    for name, module in ops.reference_names().items():
        assert getattr(ref, name) is getattr(_module(f"tilesim.reference.{module}"), name), name
    own = {"judge", "Verdict", "CompareReport", "compare", "bf16_round_trip", "to_bf16",
           "to_fp8_e4m3", "ulp_distance", "widen_to_fp32"}  # fmt: skip
    assert set(ref.__all__) == set(ops.reference_names()) | own
    for name, module in ops.device_names().items():
        assert getattr(dev, name) is getattr(_module(f"tilesim.device.{module}"), name), name
    backend = {"compile_stats", "reset_compile_stats", "allow_in_graph"}
    assert set(dev.__all__) == set(ops.device_names()) | backend


def test_the_structural_test_reads_the_registry():
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        structure = _module("test_structure")
    finally:
        sys.path.remove(str(ROOT / "tests"))
    assert structure.OPS == ops.kernel_ops()
    assert structure.RECORDED == ops.OP_MODULES


def test_the_digests_cover_the_registry():
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        golden = _module("digests.golden_digests")
        kernel = _module("digests.kernel_digests")
    finally:
        sys.path.remove(str(ROOT / "tests"))
    families = {spec[0] for _, spec in golden.entries()}
    assert families == set(ops.families())
    kernel_ops = {key.split("/")[0] for key, _ in kernel.entries()}
    assert kernel_ops == set(ops.kernel_ops())


def test_the_cli_reads_the_registry():
    from tilesim.cli import dumps, plot_trace

    assert dumps.STAGED_OPS == _module("tilesim.reference.judging.stages").STAGED_OPS
    assert plot_trace._MSA_INDEXER_OPS == ops.record("msa_indexer").call_names


# ----------------------------------------------------------------------------- no own lists
#: the consumers of the registry
#: (``reference/__init__.py`` and ``device/__init__.py`` import and list the registry's names
#: by name, for readers and their tools: test_the_packages_export_the_registrys_names holds
#: those lists equal to the registry instead)
CONSUMERS = (
    "reference/judging/__init__.py",
    "reference/judging/float_rules.py",
    "reference/judging/plans.py",
    "reference/judging/stages.py",
    "shared/registry/case_schema.py",
    "tests/test_structure.py",
    "tests/bench/__main__.py",
    *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "reference" / "cases").glob("*.py")),
    *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "app" / "cli").glob("*.py")),
    *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests" / "digests").glob("*.py")),
)


def _names() -> set[str]:
    return {*ops.OP_MODULES, *ops.families(), *(c.name for c in CALLS)}


def _literal_names(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Dict):
        items = [*node.keys, *node.values]
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = node.elts
    else:
        return []
    return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]


def _per_op_table(rel: str, sub: ast.AST, hits: list[str]) -> bool:
    """A family's case module may key a table of per-op data (tolerance, builder, rule) by
    exactly the calls its cases make (the registry's golden calls of the family)."""
    family = Path(rel).name.removesuffix(".py")
    if not rel.startswith("reference/cases/") or family not in ops.families():
        return False
    keys = [k.value for k in getattr(sub, "keys", []) if isinstance(k, ast.Constant)]
    return isinstance(sub, ast.Dict) and keys == hits == list(ops.golden_calls(family))


def _own_lists(rel: str, source: str | None = None) -> list[str]:
    """The module-level literals of ``rel`` (or of ``source``, read as ``rel``) naming two or
    more ops, calls or families."""
    names, found = _names(), []
    text = (ROOT / rel).read_text() if source is None else source
    for node in ast.parse(text).body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        for sub in ast.walk(node.value):
            hits = [n for n in _literal_names(sub) if n in names]
            if len(hits) >= 2 and not _per_op_table(rel, sub, hits):
                found.append(f"{rel}:{node.lineno}: {hits}")
    return found


@pytest.mark.parametrize("rel", CONSUMERS)
def test_no_consumer_keeps_its_own_list_of_ops(rel):
    found = _own_lists(rel)
    assert not found, "\n".join(found)


def test_an_own_list_is_found():
    src = (
        'FAMILIES = ("moe", "dsa")\nTABLE = {"msa_indexer": 1, "dsa_indexer": 2}\nONE = ("moe",)\n'
    )
    found = _own_lists("device/__init__.py", src)
    assert [f.split(":")[1] for f in found] == ["1", "2"], found


def test_the_decode_steps_defaults_are_its_two_halves():
    """``dsa_decode_step`` composes the indexer and the sparse attention: every argument it
    shares with the indexer's prototype, the attention's keywords or its own attention half
    (``step_attention``) has the same default there, so a default is one value in the step."""
    from tilesim.reference.dsa_attention_step import step_attention
    from tilesim.shared import dsa, dsa_attention_step, dsa_indexer

    step = inspect.signature(dsa_attention_step.decode_step_inputs).parameters
    halves = [dsa_indexer.indexer_inputs, dsa.model_keywords, step_attention]
    shared = 0
    for half in halves:
        for name, p in inspect.signature(half).parameters.items():
            if name in step and p.default is not inspect.Parameter.empty:
                assert step[name].default == p.default, (half.__name__, name)
                shared += 1
    assert shared >= 10
    assert "q_lens" not in step  # decode: s1 = T // B


@pytest.mark.parametrize("bad", [True, 0, -1.0, float("inf"), float("nan"), (1.4, 1.4), "1.4"])
def test_a_calibrated_bound_is_one_finite_positive_number(bad):
    from tilesim.shared.registry.op_record import Call, Output

    out = (Output("out", "float"),)
    assert Call("op", "op", out, l2_units=1.4).l2_units == 1.4
    with pytest.raises(ValueError, match=r"^Call\('op'\)\.l2_units: expected a finite positive"):
        Call("op", "op", out, l2_units=bad)
