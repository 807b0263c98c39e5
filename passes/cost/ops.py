"""Every op of the IR that no strategy formula prices, counted per row and per edge for the cost model.

Why this module exists: the strategy formulas price the dense maps
(`linear`, at the GEMM rate), the aggregations (`spmm`, `gather`, at the SpMM
rate) and the exchanges, which on a CPU are about a quarter of an epoch.
The rest of the epoch is the other ops: activations, bias, dropout's masks,
attention scores and their softmax, the loss, every dense layer between
graph layers, and each op's dispatch. This module counts them in the IR,
once per compile, as a `LayerOpWork` per graph layer: for every op its
class (`op_class`: one of gnnc.cluster.OP_CLASSES, whose seconds per element
`gnnc probe` measures), the side it runs on and its elements per row or per
edge; the formulas charge `op_time(layer, side, phase)` on the rows and edges
each strategy computes (gnnc.passes.cost.compute.layer_ops). A dropout also
counts its rows (`dropout_row`): a row's mask starts with a hash of its key,
which a narrow value (an edge's attention, one per head) pays per element;
an attention op its edges (`attention_row`: an edge's index and its
destination's segment cost the same for one head as for eight). An
aggregation whose reducer works on its output rows after the edges (its
ReducerDef's `cost.row`: std's mean, variance and square root) counts that
as elementwise work on the `out` side; sum, mean, max and min have none.

Sides. A graph layer's vertex ops before its first op that reads the
structure run on the rows its dense map runs on (its input rows: `in`; GAT's
scores); those after it on the rows it outputs (`out`; bias, concat); its
edge ops on its edges (`edge`). A dense layer runs on the rows of the value
it reads, which the graph layer before it left (gnnc.runtime.distributed:
rows of different layers are prefixes of one order): its ops count on that
layer's `out` side; the dense layer before the first graph layer (dropout of
the input features) on layer 0's `in` side. The loss is in the dense layer
after the last graph layer, on its output rows.

Sparse input features (a bag-of-words graph's, gnnc.graph.sparse_if_sparse):
the ops the executor runs on them as they are (`SPARSE_INPUT_OPS`) do work
per nonzero, rho (`input_density`) of each row's elements: dropout draws at
the nonzeros only (one hash each, a row's worth) and keeps them sparse; any
other op densifies them first (an elementwise write of the whole width). A
dense map reading them is a sparse-dense product (`sparse_values`, which
choose-strategy counts into LayerShape.sparse_gemms).

Dense layers' dense maps: a `linear` outside a graph layer (GCNII's input map before its first graph layer, its
classifier after the last) is no strategy's to price (they price the graph layers' own), so it is counted here
too, as (side, d_in, d_out, sparse input, input gradient) in `LayerOpWork.dense_maps`, and priced at the GEMM rate
per row of its side (`op_time` sides dense_in, dense_out): a strategy computing more rows than it owns runs it on
all of them (DepCache's HV_k; session 25: unpriced, GCNII's 512 -> 32 map put DepCache at 1.37-1.60x its
prediction on the extended grid's SBM x4).

Backward: an op whose result depends on a parameter has one (autograd skips
the others, such as the dropout of the input features). Exchanges are not
counted at all, their dispatch included (each formula's message start-ups,
alpha, price it): so the count is the same before insert-comm places them,
when the planner prices, and after. Evaluation: the
same ops forward, dropout costing nothing (it is the identity there). A
hoisted op (gnnc.passes.hoist) runs once per run and costs nothing per epoch.
"""
from __future__ import annotations

import math

from gnnc.ir import Eqn, Program
from gnnc.ir.dims import eval_dim
from gnnc.ir.ops import op_def, reads_structure
from gnnc.ir.reducers import reducer
from gnnc.passes.analysis.layers import param_dependent
from gnnc.passes.cost.symbols import LayerOpWork

# priced by every strategy's formula: the dense map (gemm_time) and the aggregations (spmm_time)
KERNEL_OPS = frozenset({"linear", "spmm", "gather"})
# no work of their own: a constant, stored edge data, a sync (the identity, or P3's pull, an exchange)
FREE_OPS = frozenset({"const", "edata", "sync"})
# the ops gnnc's executor runs on sparse input features as they are (its implementations registered with
# sparse_input=True; tests/test_cost_ops.py checks that the two agree): dropout keeps them sparse, linear
# multiplies them as a sparse-dense product; any other op densifies them first
SPARSE_INPUT_OPS = frozenset({"dropout", "linear"})
# the classes that also cost per row (or edge) whatever its elements, and the class that prices that
PER_ROW = {"dropout": "dropout_row", "attention": "attention_row"}
# the losses (cross_entropy, mse, bce: ops.loss_ops) read each row of their widest input once and write a scalar
_CLASS_OF = {"dropout": "dropout", "cross_entropy": "loss", "mse": "loss", "bce": "loss", "sddmm": "attention",
             "edge_softmax": "attention", "src": "copy", "dst": "copy", "pair_src": "copy", "pair_dst": "copy",
             # graph classification's readouts: each vertex row read once and added (or maxed) into its graph's
             # row, per vertex element as a copy; the ops after them run on graph rows, a graph's share of its
             # vertices' (eqn_work counts vertex and edge rows only)
             "global_sum_pool": "copy", "global_mean_pool": "copy", "global_max_pool": "copy"}


def op_class(e: Eqn) -> str | None:
    """The class equation `e` is priced in (gnnc.cluster.OP_CLASSES), "free" for an op with no work of its
    own, None for one a strategy's formula prices (dense maps, aggregations, exchanges). Any other op,
    a plugin's too, is elementwise. A concat of one value (a multi-head value's heads side by side) is a
    view of it: free."""
    return class_of(e.op, len(e.ins))


def class_of(op: str, inputs: int) -> str | None:
    """`op_class` from the op's name and its number of inputs (what `gnnc probe` records of each equation
    it times)."""
    if op == "concat" and inputs == 1:
        return "free"
    if op in KERNEL_OPS or op_def(op).comm:
        return None
    if op in FREE_OPS:
        return "free"
    return _CLASS_OF.get(op, "elementwise")


def _elements(value, config) -> float:
    """Elements per row (or per edge) of a value: the product of its feature dims (1 for none)."""
    return float(math.prod(eval_dim(d, config) for d in value.type.shape)) if value.type is not None else 0.0


def eqn_work(e: Eqn, config) -> tuple[str, float]:
    """(domain, elements per row) of an equation's work: the widest of its result and tensor inputs
    (a reduction such as `dot` or the loss reads more than it writes), in the domain of that value."""
    best = ("scalar", 0.0)
    for v in (*e.outs, *e.ins):
        if v.type is None or v.type.domain not in ("vertex", "edge", "pair"):
            continue
        n = _elements(v, config)
        if n > best[1]:
            best = (v.type.domain, n)
    return best


def sparse_values(program: Program) -> set[str]:
    """The values that are the input features, or a dropout of them, kept sparse (when the features are stored
    sparse): what a dense map reading one of them multiplies as a sparse-dense product."""
    out = {v.name for v in program.inputs if v.name == "x"}
    for layer in program.layers:
        for e in layer.eqns:
            if e.op == "dropout" and e.ins and e.ins[0].name in out:
                out.add(e.outs[0].name)
    return out


def program_op_work(program: Program, dense: bool = True, input_density: float = 1.0) -> list[LayerOpWork]:
    """Each graph layer's other ops (module docstring): what `CostInputs.op_work` holds. `dense`: with the
    dense layers' ops (False: the graph layers' own, as `gnnc probe` times a layer alone). `input_density`:
    the input features' nonzero fraction when they are stored sparse (gnnc.graph.input_density), else 1."""
    config = program.config_dict()
    needs_grad = param_dependent(program)
    sparse = sparse_values(program) if input_density < 1.0 else set()
    graph_layers = program.graph_layers()
    if not graph_layers:
        return []
    work: list[dict] = [{"forward": [], "backward": [], "calls_f": 0, "calls_b": 0, "parts_f": 0, "parts_b": 0,
                         "maps": []} for _ in graph_layers]
    index = -1  # the graph layer the next dense layer's ops belong to (-1: before the first one)
    for layer in program.layers:
        graph = layer.kind == "graph"
        if graph:
            index += 1
        elif not dense:
            continue
        into = work[max(index, 0)]
        after_structure = False
        for e in layer.eqns:
            if e.attr("hoisted") or op_def(e.op).comm:  # an exchange's start-up is its formula's (alpha)
                continue
            backward = any(o.name in needs_grad for o in e.outs)
            into["calls_f"] += 1
            into["calls_b"] += backward
            # run once per source part under a split exchange (the schedule pass's `split` rule: on edges, or
            # reading the exchanged rows, which only the equations reading the structure do)
            if graph and (reads_structure(e) or any(_on_edges(v) for v in (*e.ins, *e.outs))):
                into["parts_f"] += 1
                into["parts_b"] += backward
            if graph and reads_structure(e):
                after_structure = True
            side = "in" if (graph and not after_structure) or (not graph and index < 0) else "out"
            reads_sparse = [v for v in e.ins if v.name in sparse]
            if reads_sparse and e.op not in SPARSE_INPUT_OPS:  # densified first: every element written
                into["forward"].append((side, "elementwise", _elements(reads_sparse[0], config)))
            finalise = reducer(e.attr("reduce")).cost.row if e.op in ("spmm", "gather") else 0.0
            if finalise:  # the reducer's work per output row after its edges (std's), elementwise on those rows
                entry = ("out", "elementwise", finalise * _elements(e.outs[0], config))
                into["forward"].append(entry)
                if backward:
                    into["backward"].append(entry)
            if not graph and e.op == "linear":  # a dense layer's map: no strategy's formula prices it
                into["maps"].append((side, _elements(e.ins[0], config), _elements(e.outs[0], config),
                                     input_density if reads_sparse else None, e.ins[0].name in needs_grad))
            cls = op_class(e)
            if cls in (None, "free"):
                continue
            domain, n = eqn_work(e, config)
            if n == 0.0:
                continue
            if domain == "edge":
                side = "edge"
            elif domain == "pair":  # link prediction's pairs, counted on the message edges (pairs_per_edge)
                side, n = "edge", n * pairs_per_edge(program)
            if cls == "dropout" and reads_sparse:  # at the nonzeros only, one hash each
                entries = [(side, "dropout", n * input_density), (side, "dropout_row", n * input_density)]
            else:
                entries = [(side, cls, n)] + ([(side, PER_ROW[cls], 1.0)] if cls in PER_ROW else [])
            into["forward"] += entries
            if backward:
                into["backward"] += entries
    return [LayerOpWork(_merged(w["forward"]), _merged(w["backward"]), w["calls_f"], w["calls_b"], w["parts_f"],
                        w["parts_b"], dense_maps=tuple(w["maps"]), op_elements=_op_elements(w["forward"]))
            for w in work]


def _op_elements(entries: list[tuple[str, str, float]]) -> tuple[tuple[str, float], ...]:
    """Per side, the elements per row (edge) of one elementwise op, weighted by its work (sum n^2 / sum n): the
    width its working set is priced at (LayerOpWork.op_elements), not the side's summed elements."""
    sums: dict[str, list[float]] = {}
    for side, cls, n in entries:
        if cls == "elementwise" and n > 0:
            acc = sums.setdefault(side, [0.0, 0.0])
            acc[0] += n * n
            acc[1] += n
    return tuple((side, sq / total) for side, (sq, total) in sorted(sums.items()))


def _on_edges(v) -> bool:
    return v.type is not None and v.type.domain == "edge"


def pairs_per_edge(program: Program) -> float:
    """A training step's scored pairs per message-passing edge of a link-prediction program: one positive per
    training edge, whose two directions an undirected graph passes messages over, and neg_ratio negatives each
    (gnnc.graph.edge_split); the evaluation's pairs (a sixth of the training edges with 85/5/10) are not told
    apart."""
    return (1.0 + float(dict(program.training).get("neg_ratio", 1.0))) / 2.0


def _merged(entries: list[tuple[str, str, float]]) -> tuple[tuple[str, str, float], ...]:
    """Elements summed per (side, class), in a fixed order (the work is a cached analysis's value)."""
    out: dict[tuple[str, str], float] = {}
    for side, cls, n in entries:
        out[(side, cls)] = out.get((side, cls), 0.0) + n
    return tuple((side, cls, n) for (side, cls), n in sorted(out.items()))


def optimizer_work(program: Program) -> tuple[float, int]:
    """(parameter elements, parameter tensors) an optimizer step updates."""
    config = program.config_dict()
    params = list(program.params())
    return float(sum(math.prod(eval_dim(d, config) for d in p.value.type.shape) for p in params)), len(params)
