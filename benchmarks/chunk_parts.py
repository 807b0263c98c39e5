"""What one more part of a chunked halo costs (issue 38 item 4): a layer's per-part equations, forward and
backward, run in one process on a rank's real parts, 2 parts (the held rows, the halo) against P (the held rows,
one per peer).

    python benchmarks/chunk_parts.py [--models sage gat] [--repeat 40]

Why this exists: the schedule pass charges each extra part of a chunked halo the dispatch of the layer's ops
(gnnc.passes.cost.overlap); this measures what a part costs in gnnc.runtime.parts.run_split, on rank 0 of the
4-worker plan of benchmarks/cluster/chunk_overlap.py (its graph, DepComm, METIS), the halo's rows given as a
PartStream of separate tensors as a rank receives them. Medians of `--repeat` runs of each, alternating, one
thread; per extra part: (chunked - whole) / (P - 2). Then the dispatch of one equation as `gnnc probe` measures it, the rate the cost
model charges each of a part's equations at (gnnc.passes.cost.overlap).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "cluster"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=["sage", "gat"])
    ap.add_argument("--repeat", type=int, default=40)
    args = ap.parse_args(argv)
    import torch

    from chunk_overlap import GRAPH
    from gnnc import api
    from gnnc.ir.dims import eval_dim
    from gnnc.passes.manager import DEFAULT_PIPELINE, DISTRIBUTED_PIPELINE
    from gnnc.plan.schedule_attrs import exchange_schedule, split_eqn
    from gnnc.plan.shards import load_rank
    from gnnc.runtime.distributed import part_bounds
    from gnnc.runtime.executor import ExecContext, PrefixRowsInterpreter
    from gnnc.runtime.parts import PartRun, PartStream, run_split

    torch.set_num_threads(1)
    workers = 4
    graph = api.load_graph(GRAPH)
    print(f"load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}", flush=True)
    for name in args.models:
        plan = api.compile(api.load_model(Path(__file__).resolve().parent.parent / "examples" / f"{name}.gnn"), graph,
                           workers=workers, strategy="depcomm", partition="metis",
                           passes=DEFAULT_PIPELINE + DISTRIBUTED_PIPELINE[:-1] + ["schedule{chunked=on}"])
        program, cfg = plan.program, plan.program.config_dict()
        with tempfile.TemporaryDirectory(prefix="gnnc-parts-") as tmp:
            data = load_rank(plan.write_shards(Path(tmp) / name), 0, workers)
        interp = PrefixRowsInterpreter(program)
        for layer in program.graph_layers():
            lgl = data.lg.layers[layer.name]
            halo = next(e for e in layer.eqns if exchange_schedule(e).split)
            chunked = part_bounds(lgl, halo, data.lg.block_rows, 0)
            whole = (0, lgl.n_in, lgl.n_in + lgl.halo.n_halo)
            eqns = [e for e in layer.eqns if split_eqn(e)]
            made = {o.name for e in eqns for o in e.outs}
            ctx = ExecContext(views=lgl.views, vertex_ids=lgl.ids, config=cfg, training=True,
                              dropout_key=lambda stream: 7, loss_count=1.0, fuse=False)
            exchanged = {h.outs[0].name for h in layer.eqns if exchange_schedule(h).split}
            given: dict[str, torch.Tensor] = {}
            for e in eqns:
                for v in e.ins:
                    if v.name in made or v.name in given or v.type is None or v.type.domain != "vertex":
                        continue
                    rows = lgl.n_in + lgl.halo.n_halo if v.name in exchanged else len(lgl.ids)
                    given[v.name] = torch.randn(int(rows), *(int(eval_dim(d, cfg)) for d in v.type.shape))

            def run(bounds: tuple[int, ...]) -> None:
                parts = PartRun(lgl.parts(layer.edges, bounds))
                env: dict = {}
                for k, x in given.items():
                    if k in exchanged:  # a halo's rows as a rank gets them: one tensor per part
                        pieces = [x[bounds[p]:bounds[p + 1]].clone().requires_grad_() for p in range(len(bounds) - 1)]
                        env[k] = PartStream(pieces[0], iter(pieces[1:]), len(pieces))
                    else:
                        env[k] = x.clone().requires_grad_()
                for e in eqns:
                    env[e.outs[0].name] = run_split(e, [env[v.name] for v in e.ins], parts,
                                                    lambda eq, xs, view: interp.compute(eq, xs, view, ctx), True)
                env[eqns[-1].outs[0].name].sum().backward()

            def timed(bounds: tuple[int, ...]) -> float:
                t0 = time.perf_counter()
                run(bounds)
                return time.perf_counter() - t0

            for _ in range(3):
                run(whole), run(chunked)
            # alternating, so that a change of the machine's load falls on both alike
            pairs = [(timed(whole), timed(chunked)) for _ in range(args.repeat)]
            tw, tc = statistics.median(w for w, _ in pairs), statistics.median(c for _, c in pairs)
            extra = len(chunked) - 1 - 2
            print(f"{name} {layer.name}: {len(eqns)} per-part equations ({', '.join(e.op for e in eqns)}), "
                  f"{lgl.views[layer.edges].csr.indices.numel()} edges; fwd+bwd whole (2 parts) {tw * 1e3:.2f} ms, "
                  f"chunked ({len(chunked) - 1} parts) {tc * 1e3:.2f} ms, "
                  f"per extra part {(tc - tw) / extra * 1e3:.2f} ms",
                  flush=True)
    # the dispatch of one equation as `gnnc probe` measures it (the median over PROBE_OPS_MODEL's equations run
    # alone on its dispatch graph, gnnc.passes.cost.fit), the rate the model charges a part's equations at
    from gnnc.graph.generators import rmat
    from gnnc.runtime.probe import DISPATCH_GRAPH, PROBE_OPS_MODEL, PROBE_OPS_WIDTHS, eqn_times

    features, hidden, classes = PROBE_OPS_WIDTHS
    small = rmat(*DISPATCH_GRAPH, features=features, classes=classes, seed=0)
    ops = api.compile(api.load_model_source(PROBE_OPS_MODEL, "<gnnc probe>", features=features, hidden=hidden,
                                            classes=classes), small).program
    timed = eqn_times(ops, small)
    print(f"dispatch per equation (gnnc probe's): forward {statistics.median(t[4] for t in timed) * 1e6:.0f} us, "
          f"backward {statistics.median(t[5] for t in timed if t[5] > 0) * 1e6:.0f} us", flush=True)
    print(f"load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
