"""`gnnc run MODEL.gnn --graph tu:DIR` (or `graphs:...`): graph classification, compiled and trained.

Where the layers meet for graph classification: the model is compiled against the dataset's dims (features,
classes) with the default pipeline, then trained on mini-batches of graphs in this process or data-parallel on
`nproc` local processes (gnnc.runtime.graph_task). The split is run `fold` of 10-fold stratified cross
validation (gnnc.graph.graph_batches), fold 0 by default.
"""
from __future__ import annotations

from gnnc.errors import GnncError
from gnnc.graph.tu_dataset import GraphDataset, load_graph_dataset
from gnnc.ir import Program
from gnnc.ir.ops import READOUTS, is_graph_classification
from gnnc.model_file import Model
from gnnc.passes.manager import DEFAULT_PIPELINE, run_pipeline
from gnnc.runtime.graph_task import GraphJob, GraphSplit, GraphTrainer, batch_size_of, graph_worker, train_graphs
from gnnc.runtime.launch import DEFAULT_TIMEOUT_S, launch
from gnnc.runtime.train import RunResult, TrainConfig


def compile_for(model: Model, ds: GraphDataset) -> Program:
    """The model's program for the dataset's dims, through the default pipeline; refused without a readout."""
    program = run_pipeline(model.program(ds), DEFAULT_PIPELINE)
    if not is_graph_classification(program):
        raise GnncError(f"graph dataset '{ds.name}' holds many graphs: the model must read out graph rows "
                        f"({', '.join(READOUTS)}) and classify them (loss = cross_entropy(g, y, mask = train))")
    return program


def refuse_flags(**given: object) -> None:
    """Refuse, naming it, a `gnnc run` flag graph classification does not take (rather than ignore it)."""
    for flag, value in given.items():
        if value not in (None, False, 0):
            raise GnncError(f"--{flag.replace('_', '-')}: not available for graph classification (a dataset of many "
                            "graphs) yet")


def run(model: Model, spec: str, cfg_flags: dict, nproc: int = 1, split: GraphSplit = GraphSplit(),
        timeout_s: float | None = None, probe: bool = False) -> RunResult | dict:
    """Train `model` on the dataset `spec` names; `cfg_flags` are TrainConfig.resolve's flags (epochs, lr, ...).
    With `probe`, the first step's logits and gradients instead (tests)."""
    ds = load_graph_dataset(spec)
    program = compile_for(model, ds)
    cfg = TrainConfig.resolve(program, **cfg_flags)
    if cfg.device != "cpu":
        raise GnncError(f"--device {cfg.device}: graph classification runs on the CPU for now")
    if cfg.precision != "fp32":
        raise GnncError(f"--precision {cfg.precision}: graph classification runs in fp32 for now")
    unsupported = {"training(patience=...)": cfg.patience is not None, "--schedule-lr or training(schedule=...)":
                   cfg.schedule != "none", "--warmup or training(warmup=...)": cfg.warmup > 0}
    for what, given in unsupported.items():
        if given:
            raise GnncError(f"{what}: graph classification trains at a constant rate for every epoch, for now")
    batch_size = batch_size_of(program)
    if nproc == 1:
        if probe:
            return GraphTrainer(program, ds, cfg, split, batch_size).probe()
        result = train_graphs(program, ds, cfg, split, batch_size)
    else:
        job = GraphJob(str(program), spec, cfg, split, batch_size, probe)
        result = launch(graph_worker, nproc, job, timeout_s=DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s)[0]
    if isinstance(result, RunResult):
        result.model = program.name  # the model trained (`--model NAME`, or the file's last)
    return result
