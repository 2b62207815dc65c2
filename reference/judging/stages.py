"""The stage verdict of the DeepSeek-V3.2 layer step and its prologs: which stage failed, and why.

:func:`judge_stages` judges device outputs of ``mla_prolog``, ``dsa_indexer_prolog`` or
``dsa_attention_step`` (any subset of the op's output names) against their goldens, stage by
stage (:data:`tilesim.shared.dsa_attention_step.STAGES`: each stage's outputs and the earlier
outputs it reads), and names the first stage that fails. ``tilesim compare`` and the tests
call it; the CLI only loads arrays and prints (``docs/cli.md``, "Judging a layer step stage by
stage"; ``docs/numerics.md``, "Judging an output").

The plan, per stage of the step (one rule for every stage, the same as the decode step's
attention in :mod:`tilesim.reference.judging.plans`): a stage is judged against its golden
**recomputed from the device's own upstream outputs when the device dumped them, they differ
from the golden's bytes, and every one that differs passed its own stage** (ids: the same sets
up to score ties; floats and caches: within their rule). Otherwise it is judged against the
stored golden: an upstream not dumped, or equal to the golden's, changes nothing; an upstream
that failed its own stage is not trusted as the input of a recomputation (the verdict already
names that earlier stage, and a golden recomputed from a wrong value would pass a later stage
that computes the layer's wrong output). The report says which golden and why.

* ``mla_prolog``: its seven outputs against the stored golden (its inputs are the step's).
* ``dsa_indexer_prolog``: reads ``q_norm`` (+ ``q_norm_scale``).
* ``dsa_indexer``: ``topk_indices`` (per-row sets, tie-aware with the scores of the same
  golden) and ``scores``, by :mod:`tilesim.reference.judging.indexer`; reads the index ``q``,
  its scale, the weights and the updated index cache.
* ``sparse_attention``: ``attn_out``; reads the ids, the queries and the updated latent cache
  (the step's own attention call).

Each recomputation calls the step's stage functions (:mod:`tilesim.reference.dsa_attention_step`),
so it is the golden the step itself would have given on those upstream values. A device
upstream the stage golden refuses (a NaN in a row it reads, a wrong dtype) is reported and the
stage is judged against the stored golden instead.

Per output (:func:`output_spec`): floats by :func:`tilesim.reference.judging.judge` under the
case table's per-output limits (INT8 path: pypto-gym's ``GYM_TOLERANCES`` of
:mod:`~tilesim.reference.cases.mla_prolog` and :mod:`~tilesim.reference.cases.dsa_indexer_prolog`;
the attention: the case's tolerance); quantized codes and quantization scales by the seeds'
element rule alone (a discrete output: one code step or one ULP of a scale is the legitimate
difference, which the golden-aware L2 bounds would count); caches as (a) every row the op does
not write byte-equal to the golden (= the cache given) and (b) the written rows decoded through
:mod:`tilesim.shared.layouts.mla_cache` / :mod:`tilesim.shared.layouts.index_cache` into their
fields (codes, rope, scales), each judged by its field's rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tilesim.reference.judging import Check, Verdict, judge
from tilesim.reference.judging.indexer import (
    IDS_TOLERANCE,
    SCORES_TOLERANCE,
    judge_ids,
    judge_scores,
)
from tilesim.shared import dsa_attention_step as step_contract
from tilesim.shared.dsa_attention_step import IPROLOG_NAMES, STAGES
from tilesim.shared.layouts.index_cache import INDEX_DIM, fp8_page_views
from tilesim.shared.layouts.mla_cache import (
    LAYOUTS,
    NOPE,
    NSCALES,
    PATH_CACHE_LAYOUT,
    ROPE,
    unpack_rows,
)
from tilesim.shared.registry.ops import calls_judged_by

#: the stage of each output (the step's stages and outputs:
#: :data:`tilesim.shared.dsa_attention_step.STAGES`)
STAGE_OF = step_contract.STAGE_OF
#: ops judged stage by stage (the registry's calls of the plan ``"stages"``), in the order
#: of the step's stages, the layer step last
_STAGED = calls_judged_by("stages")
STAGED_OPS = tuple(dict.fromkeys([*(s.name for s in STAGES if s.name in _STAGED), *_STAGED]))
#: one E4M3 code step (a neighbouring code) and the smallest E4M3 subnormal
FP8_CODE_TOL = {"atol": 2.0**-9, "rtol": 2.0**-3, "ratio": 0.005, "mode": "compare"}
#: UE8M0 (power-of-two) FP32 scales: equal, up to the ratio
FP8_SCALE_TOL = {"atol": 0.0, "rtol": 0.0, "ratio": 0.005, "mode": "compare"}
#: no published numbers: the golden-aware checks alone (the FP8 path's FP32 weights)
NUMBERLESS = {"atol": None, "rtol": None, "ratio": 0.0, "mode": "ulp"}


@dataclass(frozen=True)
class Spec:
    """How one output (or one field of a cache's written rows) is judged: ``kind`` one of
    ``"float"``, ``"ids"``, ``"scores"``, ``"cache"``; ``tol`` the tolerance dict; ``rule``
    ``"seeds"`` to force the seeds' rule (discrete outputs), ``None`` for the caller's;
    ``fields`` (caches) ``{field: Spec}``; ``judge_kind`` the judge's ``kind``."""

    kind: str
    tol: dict | None = None
    rule: str | None = None
    fields: dict | None = None
    judge_kind: str | None = None


def _gym(table: dict, key: str) -> dict:
    atol, rtol, ratio = table[key]
    return {"atol": atol, "rtol": rtol, "ratio": ratio, "mode": "compare"}


def output_spec(name: str, path: str, case_tol: dict) -> Spec:
    """The rule of the step output ``name`` on ``path`` (``"int8"`` / ``"fp8"``);
    ``case_tol``: the case's tolerance (the attention output's)."""
    from tilesim.reference.cases.dsa_indexer_prolog import GYM_TOLERANCES as IP
    from tilesim.reference.cases.mla_prolog import GYM_TOLERANCES as MLA

    int8 = path == "int8"
    codes = Spec("float", _gym(MLA, "kv_cache") if int8 else FP8_CODE_TOL, "seeds")
    scales = Spec("float", _gym(MLA, "kv_scale_cache") if int8 else FP8_SCALE_TOL, "seeds")
    rope = Spec("float", _gym(MLA, "kr_cache"))
    k_codes = Spec("float", _gym(IP, "k_cache") if int8 else FP8_CODE_TOL, "seeds")
    k_scales = Spec("float", _gym(IP, "k_scale") if int8 else FP8_SCALE_TOL, "seeds")
    latent = {"kv_cache": {"codes": codes, "rope": rope, "scales": scales},
              "kr_cache": {"rope": rope}, "kv_scale_cache": {"scales": scales}}  # fmt: skip
    if name in latent:  # a kv_split cache holds one field each, a packed row all three
        return Spec("cache", fields=latent[name])
    if name == "k_cache":  # INT8 codes; FP8 pages hold the scales too
        return Spec("cache", fields={"codes": k_codes, "scales": k_scales})
    if name == "k_scale":
        return Spec("cache", fields={"scales": k_scales})
    query = Spec("float", _gym(MLA, "query_nope"))
    table = {
        "query_nope": query,
        "query_rope": Spec("float", _gym(MLA, "query_rope")),
        "q_norm": Spec("float", _gym(MLA, "q_norm"), "seeds") if int8 else query,
        "q_norm_scale": Spec("float", _gym(MLA, "q_norm_scale"), "seeds"),
        "index_q": Spec("float", _gym(IP, "q") if int8 else FP8_CODE_TOL, "seeds"),
        "index_q_scale": Spec("float", _gym(IP, "q_scale") if int8 else FP8_SCALE_TOL, "seeds"),
        "index_weights": Spec("float", _gym(IP, "weights") if int8 else NUMBERLESS),
        "topk_indices": Spec("ids", IDS_TOLERANCE, judge_kind="dsa_indexer"),
        "scores": Spec("scores", SCORES_TOLERANCE),
        "attn_out": Spec("float", case_tol, judge_kind="dsa"),
    }
    return table[name]


# ----------------------------------------------------------------------------- results
def _check_words(c: Check) -> str:
    op = ">=" if c.higher_is_better else "<="
    return f"{c.name} {c.value:.6g} (bound {op} {c.bound:.6g})"


#: "at (...)" lines of a failing verdict kept in the short report
_WORST_LINES = 2


def _short(text: list[str]) -> list[str]:
    """A failing verdict's summary without the worst elements past the first two."""
    at = [j for j, ln in enumerate(text) if ln.startswith("  at (")]
    drop = set(at[_WORST_LINES:])
    return [ln for j, ln in enumerate(text) if j not in drop]


@dataclass
class OutputResult:
    """One judged output: its verdicts (one per cache field, else one), the plan's own checks
    (a cache's untouched rows) and where its golden came from."""

    name: str
    verdicts: list = field(default_factory=list)  # [(label, Verdict)]
    checks: list = field(default_factory=list)  # [Check]
    against: str = "the stored golden"
    #: (label, actual, golden) of each verdict: the arrays it judged (the pictures' data)
    arrays: list = field(default_factory=list, repr=False)

    @property
    def passed(self) -> bool:
        return all(v.passed for _, v in self.verdicts) and all(c.passed for c in self.checks)

    def why(self) -> str:
        """The failed checks with their values and bounds (empty when it passes)."""
        parts = [_check_words(c) for c in self.checks if not c.passed]
        for label, v in self.verdicts:
            bad = [_check_words(c) for c in v.checks if not c.passed] or ["failed"]
            if v.n_nonfinite:  # a hard failure leads, whatever the counts say
                bad.insert(0, f"{v.n_nonfinite} NaN/Inf in actual (hard failure) at "
                              f"{v.nonfinite[0][0]} = {v.nonfinite[0][1]}")  # fmt: skip
            if not v.passed:
                parts.append(f"{label.split(' of ')[0] + ' ' if label else ''}{', '.join(bad)}")
        return "; ".join(parts)

    def lines(self, verbose: bool = False) -> list[str]:
        """The report: one line per verdict when it passes (unless ``verbose``), the judge's
        full summary when it fails; a cache first says which rows it checked."""
        out = []
        if self.checks:
            out.append(f"{'PASS' if self.passed else 'FAIL'} {self.name} (cache)")
            out += [c.line() for c in self.checks]
        for label, v in self.verdicts:
            text = v.summary().splitlines()
            if label:
                text[0] = f"{text[0]} [{label}]"
            tied = v.ids is not None and v.ids.tied  # accepted ties are shown, passing or not
            out += text if verbose or tied else (_short(text) if not v.passed else text[:1])
        return out


@dataclass
class StageResult:
    """One stage: its judged outputs, the golden they were judged against, notes."""

    stage: str
    outputs: list = field(default_factory=list)
    against: str = "the stored golden"
    notes: list = field(default_factory=list)

    @property
    def judged(self) -> bool:
        return bool(self.outputs)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    def why(self) -> str:
        return "; ".join(f"{o.name}: {o.why()}" for o in self.outputs if not o.passed)


@dataclass
class StageReport:
    """The verdict of :func:`judge_stages`: every stage in order (``judged`` False: no output
    of it was given) and the first stage that fails."""

    op: str
    name: str
    stages: list

    @property
    def passed(self) -> bool:
        return all(s.passed for s in self.stages)

    @property
    def first_failure(self) -> StageResult | None:
        return next((s for s in self.stages if s.judged and not s.passed), None)

    def summary(self, verbose: bool = False) -> str:
        """Per stage: PASS/FAIL and the golden it was judged against, per output one line
        (a failing one in full; ``verbose``: all in full); then the first failing stage."""
        lines = []
        for s in self.stages:
            if not s.judged:
                lines.append(f"stage {s.stage}: not dumped")
                continue
            lines.append(f"stage {s.stage}: {'PASS' if s.passed else 'FAIL'} "
                         f"(against {s.against})")  # fmt: skip
            lines += [f"  note: {n}" for n in s.notes]
            for o in s.outputs:
                lines += ["  " + ln for ln in o.lines(verbose)]
        bad = self.first_failure
        if bad is None:
            lines.append(f"PASS {self.name}: every dumped stage passes")
        else:
            lines.append(f"FAIL {self.name}: first failing stage {bad.stage}: {bad.why()}")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        bad = self.first_failure
        return {
            "passed": self.passed, "op": self.op, "name": self.name,
            "first_failing_stage": None if bad is None else bad.stage,
            "why": None if bad is None else bad.why(),
            "stages": [{"stage": s.stage, "judged": s.judged, "passed": s.passed,
                        "against": s.against, "notes": s.notes,
                        "outputs": [{"name": o.name, "passed": o.passed, "why": o.why(),
                                     "checks": [vars(c) for c in o.checks],
                                     "verdicts": [{"field": lb, **v.as_dict()}
                                                  for lb, v in o.verdicts]}
                                    for o in s.outputs]} for s in self.stages],
        }  # fmt: skip


# ----------------------------------------------------------------------------- caches
def _byte_rows(arr: np.ndarray, width_bytes: int) -> np.ndarray:
    a = np.ascontiguousarray(arr)
    return a.view(np.uint8).reshape(-1, width_bytes)


def cache_fields(name: str, arr: np.ndarray, layout: str, block_size: int) -> tuple:
    """``(byte rows [rows, bytes], {field: values [rows, width]})`` of one cache output: the
    latent cache ``kv_cache`` (``kv_split`` codes, or packed ``pypto`` / ``flashmla`` rows),
    ``kr_cache``, ``kv_scale_cache``, the index cache ``k_cache`` (INT8 codes, or FP8 pages)
    and ``k_scale``; row ``r`` is cache slot ``r``."""
    a = np.ascontiguousarray(arr)
    if name == "kv_cache" and layout in LAYOUTS:  # a packed row layout
        rows = unpack_rows(a.reshape(-1, a.shape[-1]), layout)
        fields = {"codes": rows.nope, "rope": rows.rope, "scales": rows.scales}
        return _byte_rows(a, a.shape[-1] * a.itemsize), fields
    widths = {"kv_cache": ("codes", NOPE), "kr_cache": ("rope", ROPE),
              "kv_scale_cache": ("scales", NSCALES), "k_scale": ("scales", 1)}  # fmt: skip
    if name == "k_cache" and a.dtype == np.uint8:  # FP8 pages: codes, then the scales
        v = fp8_page_views(a, block_size=block_size)
        codes, scales = v.codes.reshape(-1, INDEX_DIM), v.scales.reshape(-1, 1)
        raw = np.concatenate([_byte_rows(codes, INDEX_DIM), _byte_rows(scales, 4)], axis=1)
        return raw, {"codes": codes, "scales": scales}
    fname, w = ("codes", INDEX_DIM) if name == "k_cache" else widths[name]
    vals = a.reshape(-1, w)
    return _byte_rows(vals, w * a.itemsize), {fname: vals}


def _judge_cache(name, a, g, spec: Spec, slots, layout, block_size, rule) -> OutputResult:
    a = a.reshape(g.shape)
    if a.dtype != g.dtype:  # a dump of the same bytes under another name (uint8 for E4M3)
        if a.dtype.itemsize != g.dtype.itemsize:
            raise TypeError(f"{name}: expected {g.dtype} cache bytes, got {a.dtype}")
        a = a.view(g.dtype)
    ga, gf = cache_fields(name, g, layout, block_size)
    aa, af = cache_fields(name, a, layout, block_size)
    written = np.unique(slots[slots >= 0])
    other = np.ones(ga.shape[0], bool)
    other[written] = False
    changed = np.flatnonzero(other & np.any(aa != ga, axis=1))
    listed = ", ".join(str(int(r)) for r in changed[:10]) + (", ..." if changed.size > 10 else "")
    txt = (f"{changed.size} of {int(other.sum())} rows the op does not write differ from the "
           f"cache given" + (f": rows {listed}" if changed.size else ""))  # fmt: skip
    first = int(changed[0]) if changed.size else None
    res = OutputResult(name, checks=[Check("rows not written", not changed.size, changed.size,
                                           0, first, txt)])  # fmt: skip
    shown = ", ".join(str(int(r)) for r in written[:8]) + (", ..." if written.size > 8 else "")
    label = f"of the {written.size} written slots {shown}; rows named by slot"
    for fname, fspec in ((f, s) for f, s in spec.fields.items() if f in gf):
        pair = af[fname][written], gf[fname][written]
        res.verdicts.append(
            (f"{fname} {label}", _judge_float(*pair, fspec, rule, f"{name}.{fname}", written))
        )
        res.arrays.append((fname, *pair))
    return res


# ----------------------------------------------------------------------------- one output
def _judge_float(a, g, spec: Spec, rule: str, name: str, slots=None) -> Verdict:
    """``slots``: the cache slots of the rows of ``a`` / ``g`` (the report names them)."""
    return judge(a, g, spec.tol, rule=spec.rule or rule, name=name, kind=spec.judge_kind,
                 row_labels=slots)  # fmt: skip


def judge_output(name, a, g, spec: Spec, *, rule="default", scores=None, slots=None,
                 layout="", block_size=128, visible=None) -> OutputResult:  # fmt: skip
    """One output by its :class:`Spec` (``scores``: the golden scores of the ids; ``slots``,
    ``layout``, ``block_size``: a cache's written rows and byte layout; ``visible``: the
    indexer rows' visible lengths)."""
    if spec.kind == "cache":
        return _judge_cache(name, a, g, spec, slots, layout, block_size, rule)
    if spec.kind == "scores":
        v = judge_scores(a, g, visible=visible, name=name)
    elif spec.kind == "ids":
        v = judge_ids(a, g, scores=scores, visible=visible, tolerance=spec.tol, rule=rule,
                      name=name)  # fmt: skip
    else:
        v = _judge_float(a, g, spec, rule, name)
    return OutputResult(name, [("", v)], arrays=[("", a, g)])


# ----------------------------------------------------------------------------- the plan
def _step_args(inputs: dict, params: dict):
    """The step's checked Args (slots, latent layout) and its full argument namespace
    (:func:`tilesim.reference.dsa_attention_step.step_args`, no trace, no bar)."""
    from tilesim.reference.dsa_attention_step import step_args

    return step_args(**inputs, **{**params, "trace": None, "progress": False})


def _upstream(names, actual: dict, golden: dict):
    """``({name: array}, [device names that differ from the golden])``: each upstream output
    from the dump when given (reshaped to the golden's shape; ids to int32), else the golden's.
    A device array of another dtype raises ``TypeError``."""
    out, used = {}, []
    for n in names:
        if n not in golden:
            out[n] = None
            continue
        g = golden[n]
        if n not in actual:
            out[n] = g
            continue
        a = np.asarray(actual[n])
        if n == "topk_indices" and a.dtype.kind in "iu":
            a = a.astype(np.int32)
        if a.dtype != g.dtype or a.size != g.size:
            raise TypeError(f"the device's {n} is {a.dtype}{list(a.shape)}, the stage golden "
                            f"reads {g.dtype}{list(g.shape)}")  # fmt: skip
        a = a.reshape(g.shape)
        out[n] = a
        if a.tobytes() != g.tobytes():
            used.append(n)
    return out, used


def _recompute(stage: str, a, up: dict) -> dict:
    """The stage's golden outputs (the step's names) from the upstream arrays ``up``
    (:func:`tilesim.reference.dsa_attention_step.run_stage`, no trace, no bar)."""
    from tilesim.reference.dsa_attention_step import run_stage

    return {k: np.asarray(v) for k, v in run_stage(stage, a, up, progress=False).items()}


def _names(names) -> str:
    return ", ".join(names)


def _stage_golden(stage, upstream, a, actual, golden, passed: dict) -> tuple[dict, str, list]:
    """(golden outputs of the stage, against which in words, notes) by the rule of the module
    docstring; ``passed``: ``{output: passed}`` of the outputs judged at earlier stages."""
    if not upstream:
        return golden, "the stored golden: the stage reads only the call's inputs", []
    present = [n for n in upstream if n in golden]  # the upstream outputs this path has
    if a is None or not present:
        return golden, "the stored golden: its upstream values are the call's inputs", []
    dumped = [n for n in present if n in actual]
    if not dumped:
        return golden, f"the stored golden: no upstream output dumped ({_names(present)})", []
    try:
        up, used = _upstream(upstream, actual, golden)
    except TypeError as e:
        return golden, "the stored golden", [f"not recomputed: {e}"]
    rest = [n for n in present if n not in actual]
    tail = f"; {_names(rest)} not dumped (the golden's taken)" if rest else ""
    if not used:
        verb = "equals" if len(dumped) == 1 else "equal"
        same = f"the stored golden: the device's {_names(dumped)} {verb} the golden's{tail}"
        return golden, same, []
    failed = [n for n in used if not passed.get(n, True)]
    if failed:
        return golden, (f"the stored golden: the device's {_names(failed)} failed at "
                        f"{_names(dict.fromkeys(STAGE_OF[n] for n in failed))}, so no golden is "
                        "recomputed from them"), []  # fmt: skip
    try:
        out = _recompute(stage, a, up)
    except (ValueError, TypeError) as e:
        note = f"the {stage} golden refused the device's {_names(used)}: {e}"
        return golden, "the stored golden", [note]
    return (
        out,
        f"the golden recomputed from the device's {_names(used)} (each passed its own stage){tail}",
        [],
    )


def _op_layout(op: str, inputs: dict, params: dict):
    """(slots, latent layout, block size, path, step Args or None) of a call."""
    if op == "dsa_attention_step":
        a = _step_args(inputs, params)
        return np.asarray(a.slots, np.int64), a.layout, a.ins.block_size, a.path, a
    slots = np.asarray(inputs["slot_mapping"], np.int64).reshape(-1)
    path = params.get("path", "int8")
    if op == "mla_prolog":
        layout = params.get("cache_layout") or PATH_CACHE_LAYOUT[path]
        return slots, layout, 128, path, None
    return slots, "", int(params.get("block_size", 128)), path, None


def _step_visible(a) -> np.ndarray | None:
    """The layer step's rows' visible lengths (its contract's ``host_plan``), else None."""
    if a is None:
        return None
    from tilesim.shared import dsa_attention_step as contract

    return np.asarray(contract.host_plan(a).visible)


def judge_stages(op: str, actual: dict, golden: dict, inputs: dict, params: dict, *,
                 case_tolerance: dict, rule: str = "default",
                 name: str = "") -> StageReport:  # fmt: skip
    """The stage verdict (module docstring) of device outputs ``actual`` (``{output name:
    array}``, any subset of the op's outputs) against ``golden`` (``{name: array}``, every
    output of the op) of the call ``op(**inputs, **params)``. ``case_tolerance``: the case's
    tolerance (the attention output's rule); ``rule``: ``"default"`` or ``"seeds"`` for the
    outputs whose rule is not forced. Names are the step's (``index_q``, ...); the indexer
    prolog's own names (``q``, ``q_scale``, ``weights``) are accepted for that op."""
    if op not in STAGED_OPS:
        raise ValueError(f"op: expected one of {STAGED_OPS}, got {op!r}")
    if op == "dsa_indexer_prolog":
        actual = {IPROLOG_NAMES.get(k, k): v for k, v in actual.items()}
        golden = {IPROLOG_NAMES.get(k, k): v for k, v in golden.items()}
    unknown = sorted(set(actual) - set(golden))
    if unknown:
        raise ValueError(f"actual: outputs {unknown} are not outputs of {op} ({sorted(golden)})")
    slots, layout, bs, path, a = _op_layout(op, inputs, params)
    visible = _step_visible(a)
    report = StageReport(op, name or op, [])
    passed: dict = {}
    for st in STAGES:
        if op != "dsa_attention_step" and st.name != op:
            continue
        res = StageResult(st.name)
        given = [n for n in st.outputs if n in actual and n in golden]
        if given:
            gold, res.against, res.notes = _stage_golden(st.name, st.reads, a, actual, golden,
                                                         passed)  # fmt: skip
            for n in given:
                spec = output_spec(n, path, case_tolerance)
                res.outputs.append(judge_output(
                    n, np.asarray(actual[n]), np.asarray(gold[n]), spec, rule=rule,
                    scores=gold.get("scores"), slots=slots, layout=layout,
                    block_size=bs, visible=visible))  # fmt: skip
            passed.update((o.name, o.passed) for o in res.outputs)
        report.stages.append(res)
    return report


__all__ = ["STAGED_OPS", "STAGE_OF", "Spec", "StageReport", "cache_fields", "judge_output",
           "judge_stages", "output_spec"]  # fmt: skip
