"""`--precision bf16|fp16`: 16-bit products under autocast, fp32 master weights, bytes predicted per precision.

fp32 stays exact and its plans byte-identical (tests/test_reference_plans.py); here the 16-bit side: the
kernels' outputs against float64, what predict-bytes and the cost model charge, a 2-rank run whose
measured bytes equal the prediction at bf16, fp16's loss scaling on the CPU, and (slow) bf16 training
Cora's GCN to within a point of fp32.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from _rank_pool import pooled_launch
from conftest import EXAMPLES, ROOT, random_graph
from gnnc import api
from gnnc.cluster import preset
from gnnc.errors import GnncError
from gnnc.passes.cost.symbols import CostInputs
from gnnc.plan.precision import element_bytes
from gnnc.runtime import kernels
from gnnc.runtime.distributed import DistJob, one_step_each
from gnnc.runtime.kernels import reference as ref
from gnnc.runtime.train import TrainConfig
from test_distributed_exact import measured_bytes
from test_kernels import make_csr



@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernels_compute_in_the_autocast_type(dtype: torch.dtype) -> None:
    """Under autocast SpMM and SDDMM take the 16-bit type (their fp32 inputs cast, as a matmul's are) and
    edge softmax runs in fp32; each stays within 16-bit rounding of the float64 reference."""
    csr = make_csr("hub", seed=51)
    gen = torch.Generator().manual_seed(52)
    x = torch.randn(csr.n_src, 3, 8, generator=gen)
    w = torch.rand(csr.nnz, 3, generator=gen) + 0.1
    e = torch.randn(csr.nnz, 3, generator=gen)
    b = torch.randn(csr.n_dst, 3, 8, generator=gen)
    tol = dict(rtol=3e-2, atol=3e-2)
    with torch.autocast("cpu", dtype=dtype):
        for reduce in kernels.REDUCES:
            out = kernels.spmm(csr, x, w, reduce)
            assert out.dtype == dtype
            torch.testing.assert_close(out.double(), ref.spmm(csr, x.double(), w.double(), reduce), **tol)
        dot = kernels.sddmm(csr, x, b, "dot")
        assert dot.dtype == dtype
        torch.testing.assert_close(dot.double(), ref.sddmm(csr, x.double(), b.double(), "dot"), rtol=3e-2, atol=0.2)
        soft = kernels.edge_softmax(csr, e.to(dtype))
        assert soft.dtype == torch.float32
        torch.testing.assert_close(soft.double(), ref.edge_softmax(csr, e.to(dtype).double()), rtol=1e-5, atol=1e-6)
        # the backward of a weighted SpMM: the weights' gradient is an SDDMM-dot, computed in fp32 and rounded once
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        kernels.spmm(csr, xs, ws).float().sum().backward()
    assert xs.grad.dtype == torch.float32 and ws.grad.dtype == torch.float32  # fp32 leaves get fp32 gradients
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    ref.spmm(csr, xd, wd).sum().backward()
    torch.testing.assert_close(ws.grad.double(), wd.grad, rtol=3e-2, atol=0.1)


def test_bytes_are_predicted_per_precision() -> None:
    graph = random_graph(n=60, e=300, f=16, c=4, seed=3)
    model = api.load_model(EXAMPLES / "sage.gnn")
    got = {p: api.compile(model, graph, workers=2, strategy="depcomm", partition="metis", precision=p)
           for p in ("fp32", "bf16", "fp16")}
    fp32 = got["fp32"].meta.predicted_bytes_per_step
    for p in ("bf16", "fp16"):
        step = got[p].meta.predicted_bytes_per_step
        assert step["halo"] * element_bytes("fp32") == fp32["halo"] * element_bytes(p) and step["halo"] > 0
        assert step["allreduce"] == fp32["allreduce"]  # fp32 master gradients at every precision
        assert got[p].meta.precision == p
    assert "precision" not in got["fp32"].meta.to_json()  # an fp32 plan is the file it always was


def test_the_cost_model_prices_16_bit_rates_and_bytes() -> None:
    """On a GPU preset bf16 halves the bytes of each exchanged element and runs dense maps at the tensor-core
    rate and aggregations at twice the fp32 rate (memory-bound: half the bytes per element)."""
    a100 = preset("dgx-a100")
    assert a100.rates_at("bf16") == (312e12, a100.memory_bandwidth / 2)
    assert a100.rates_at("fp32") == (a100.gemm_rate, a100.spmm_rate)
    assert preset("dgx1").rates_at("bf16")[0] == preset("dgx1").gemm_rate  # Volta: no bf16 tensor cores
    assert preset("neutronstar-ecs").rates_at("fp16")[0] == preset("neutronstar-ecs").gemm_rate  # no figure given
    graph = random_graph(n=200, e=1500, f=64, c=4, seed=5)
    model = api.load_model(EXAMPLES / "gcn.gnn", hidden=64)
    time = {p: api.compile(model, graph, workers=2, cluster="dgx-a100", precision=p).meta.planner.predicted_time_s
            for p in ("fp32", "bf16")}
    assert time["bf16"] < time["fp32"]
    from gnnc.passes.partition.stats import compute_stats
    import numpy as np

    stats = compute_stats(graph, np.arange(200) % 2, 2, "self_loops")
    inputs = {p: CostInputs.from_stats(stats, (64, 64, 4), a100.for_workers(2), precision=p) for p in ("fp32", "bf16")}
    assert [i.bytes_per_element for i in inputs.values()] == [4, 2]


def test_bf16_bytes_measured_equal_the_prediction(tmp_path) -> None:
    """Exchanged rows travel in bf16 (the runtime casts before each exchange), gradients in fp32."""
    # 8 features below the hidden 16: the aggregations run before the linear maps (reorder-gemm), so the first
    # layers exchange the fp32 input rows, which only the runtime's cast makes 16-bit
    graph = random_graph(n=60, e=300, f=8, c=4, seed=3)
    todo = []
    for name, strategy in (("sage", "depcomm"), ("gcn", "pushpull,bcast1d"), ("gat", "hybrid")):
        plan = api.compile(api.load_model(EXAMPLES / f"{name}.gnn"), graph, workers=2, strategy=strategy,
                           partition="metis", precision="bf16")
        job = DistJob(str(plan.program), str(plan.write_shards(tmp_path / name)),
                      TrainConfig(progress=False, precision="bf16"))
        todo.append((name, job, plan.meta.predicted_bytes_per_step))
    results = pooled_launch(one_step_each, 2, [job for _, job, _ in todo])[0]
    for (name, _, predicted), got in zip(todo, results):
        assert measured_bytes(got) == predicted, name
        assert all(g.dtype == torch.float32 for g in got["grads"].values())


def test_fp16_scales_the_loss_on_the_cpu(monkeypatch) -> None:
    steps = []
    real_step = torch.amp.GradScaler.step
    monkeypatch.setattr(torch.amp.GradScaler, "step", lambda self, opt: steps.append(self.get_scale()) or
                        real_step(self, opt))
    graph = random_graph(n=80, e=400, f=16, c=4, seed=6)
    result = api.run(api.load_model(EXAMPLES / "gcn.gnn"), graph, epochs=5, seed=0, precision="fp16")
    assert len(steps) == 5 and steps[0] > 1  # every step through the scaler, the loss scaled up
    assert len(result.history) == 5 and all(abs(r["loss"]) < 10 for r in result.history)
    assert result.logits.dtype == torch.float32  # the loss and the master weights stay fp32
    api.run(api.load_model(EXAMPLES / "gcn.gnn"), graph, epochs=2, seed=0, precision="bf16")
    assert len(steps) == 5  # bf16 has fp32's range: no scaler


def test_a_plan_runs_at_the_precision_it_was_compiled_for(tmp_path) -> None:
    graph = random_graph(n=40, e=150, f=8, c=3, seed=1)
    plan = api.compile(api.load_model(EXAMPLES / "gcn.gnn"), graph, precision="bf16")
    plan.save(tmp_path / "plan")
    loaded = api.Plan.load(tmp_path / "plan")
    assert api.plan_precision(loaded, None) == "bf16"
    with pytest.raises(GnncError, match="compiled for bf16; recompile it with .*--precision fp32"):
        api.plan_precision(loaded, "fp32")


@pytest.mark.slow
def test_bf16_trains_cora_gcn_within_a_point_of_fp32() -> None:
    """The issue's check on the CPU: test accuracy at the best validation epoch, mean over 3 seeds."""
    runs = {}
    for precision in ("fp32", "bf16"):
        accs = []
        for seed in range(3):
            r = subprocess.run([sys.executable, "-m", "gnnc", "run", str(EXAMPLES / "gcn.gnn"), "--graph",
                                "planetoid:cora", "--seed", str(seed), "--precision", precision, "--json"],
                               capture_output=True, text=True, cwd=ROOT, timeout=900)
            assert r.returncode == 0, r.stderr
            accs.append(json.loads(r.stdout.strip().splitlines()[-1])["test_acc"])
        runs[precision] = sum(accs) / len(accs)
    assert abs(runs["bf16"] - runs["fp32"]) <= 0.01, runs
