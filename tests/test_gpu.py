"""On a GPU: every example and every strategy computes on CUDA what it computes on the CPU (`make gpu-check`).

Marked `gpu` and skipped without a CUDA device (tests/test_kernels.py holds the kernels' own CUDA checks
against float64, and the Triton kernels' below). Each example's logits and every parameter gradient after a
training-mode step on CUDA are within 1e-4 relative of the CPU's (cuSPARSE and cuBLAS sum in other orders
than MKL, so not bit for bit); every strategy runs on 2 GPUs with NCCL where 2 are present, compared with
one process on the CPU, its bytes equal to the plan's prediction at fp32 and at bf16 (GNNPipe's pipeline,
approximate, against its own run on 2 CPU processes); sampled minibatches in one process train as on the CPU;
bf16 and fp16 train Cora's GCN to within a point of fp32.
"""
from __future__ import annotations

import importlib.util

import pytest
import torch

from conftest import EXAMPLES, random_graph
from gnnc import api
from gnnc.runtime.distributed import DistJob, one_step_each
from gnnc.runtime.executor import init_params
from gnnc.runtime.launch import launch
from gnnc.runtime.train import TrainConfig, Worker

GPUS = torch.cuda.device_count()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPUS == 0, reason="needs a CUDA device")]
EXAMPLE_CASES = {"gcn": {}, "sage": {}, "gin": {}, "gat": {}, "gcnii": {"layers": 4}, "sgc": {}}
TOL = 1e-4


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


def step_on(device: str, program, graph, seed: int = 0) -> tuple[torch.Tensor, dict[str, torch.Tensor], float]:
    """Logits, parameter gradients and loss of one training-mode forward and backward, on the host."""
    worker = Worker(program, graph, TrainConfig(progress=False, device=device, seed=seed))
    params = init_params(program, seed, worker.device)
    logits, loss = worker.forward(params, True, 0)
    loss.backward()
    return logits.detach().cpu(), {k: p.grad.cpu() for k, p in params.items()}, float(loss)


@pytest.mark.parametrize("name", list(EXAMPLE_CASES))
def test_every_example_on_cuda_matches_the_cpu(name: str) -> None:
    graph = api.load_graph("planetoid:cora")
    program = api.compile(api.load_model(EXAMPLES / f"{name}.gnn", **EXAMPLE_CASES[name]), graph).program
    cpu_logits, cpu_grads, cpu_loss = step_on("cpu", program, graph)
    gpu_logits, gpu_grads, gpu_loss = step_on("cuda", program, graph)
    assert rel(gpu_logits, cpu_logits) < TOL
    assert abs(gpu_loss - cpu_loss) < TOL * abs(cpu_loss)
    bad = {k: rel(gpu_grads[k], g) for k, g in cpu_grads.items() if rel(gpu_grads[k], g) >= TOL}
    assert not bad, f"gradients differ: {bad}"


@pytest.mark.parametrize("name", list(EXAMPLE_CASES))
def test_every_example_trains_on_cuda_as_on_the_cpu(name: str) -> None:
    graph = api.load_graph("planetoid:cora")
    model = api.load_model(EXAMPLES / f"{name}.gnn", **EXAMPLE_CASES[name])
    plan = api.compile(model, graph)
    cpu = api.run(plan, graph, epochs=3, seed=0)
    gpu = api.run(plan, graph, epochs=3, seed=0, device="cuda")
    assert gpu.logits.device.type == "cpu"  # handed back on the host
    assert rel(gpu.logits, cpu.logits) < 1e-3  # three Adam steps on sums in another order


STRATEGIES = ["depcomm", "depcache", "hybrid", "bcast1d", "pushpull,depcomm", "depcomm,depcache",
              "depcache,depcomm", "pushpull,bcast1d"]
PUSHPULL_LEGAL = {"gcn", "sage"}


@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_every_strategy_on_two_gpus_matches_one_process(precision: str, tmp_path) -> None:
    graph = random_graph(n=300, e=2400, f=32, c=5, seed=4)
    todo = []
    for name in ("gcn", "sage", "gin", "gat"):
        model = api.load_model(EXAMPLES / f"{name}.gnn")
        single = api.compile(model, graph).program
        for strategy in STRATEGIES:
            if strategy.startswith("pushpull") and name not in PUSHPULL_LEGAL:
                continue
            plan = api.compile(model, graph, workers=2, strategy=strategy, partition="metis", precision=precision)
            shards = plan.write_shards(tmp_path / f"{name}-{strategy}-{precision}")
            job = DistJob(str(plan.program), str(shards),
                          TrainConfig(progress=False, device="cuda", precision=precision, seed=3))
            todo.append(((name, strategy), single, job, plan.meta.predicted_bytes_per_step))
    results = launch(one_step_each, 2, [job for _, _, job, _ in todo], device="cuda")[0]
    op_names = {"halo": "halo", "bcast_rows": "broadcast", "reduce_scatter": "reduce_scatter", "allreduce": "allreduce"}
    failures = []
    for (key, single, _, predicted), got in zip(todo, results):
        measured = {k: got["bytes_by_op"].get(op, 0) for k, op in op_names.items()}
        if measured != predicted:  # NCCL's byte counters are gnnc's own: exact at every precision
            failures.append(f"{key}: measured bytes {measured} != predicted {predicted}")
        if precision != "fp32":
            continue
        logits, grads, loss = step_on("cpu", single, graph, seed=3)
        if rel(got["logits"], logits) > TOL:
            failures.append(f"{key}: logits differ by {rel(got['logits'], logits):.2e}")
        failures += [f"{key}: gradient of {k} differs by {rel(got['grads'][k], g):.2e}"
                     for k, g in grads.items() if rel(got["grads"][k], g) > TOL]
    assert not failures, "\n".join(failures)


@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs")
def test_the_pipeline_on_two_gpus_matches_its_cpu_run(tmp_path) -> None:
    """GNNPipe's pipeline is approximate: its step on 2 GPUs (a refresh, then the pipelined step of epoch 1)
    is compared with the same step on 2 CPU processes, bytes and all."""
    from gnnc.runtime.pipeline import one_step_each as pipeline_steps

    graph = random_graph(n=300, e=2400, f=32, c=5, seed=4)
    model = api.load_model(EXAMPLES / "gcnii.gnn", layers=4)
    plan = api.compile(model, graph, workers=2, strategy="pipeline", approximate=True)
    shards = plan.write_shards(tmp_path / "pipeline")
    got = {}
    for device in ("cpu", "cuda"):
        job = DistJob(str(plan.program), str(shards), TrainConfig(progress=False, device=device, seed=3))
        got[device] = launch(pipeline_steps, 2, [job], [1], device=device)[0][0]
    cpu, gpu = got["cpu"], got["cuda"]
    assert gpu["bytes"] == cpu["bytes"] and gpu["refresh_bytes"] == cpu["refresh_bytes"]
    assert rel(gpu["logits"], cpu["logits"]) < TOL
    bad = {k: rel(gpu["grads"][k], g) for k, g in cpu["grads"].items() if rel(gpu["grads"][k], g) >= TOL}
    assert not bad, f"gradients differ: {bad}"


def test_sampled_minibatches_on_cuda_train_as_on_the_cpu() -> None:
    """One process, sampled on the host, each minibatch's blocks on the GPU: the same run as on the CPU."""
    from gnnc.graph.sampling import SamplingConfig

    graph = api.load_graph("planetoid:cora")
    model = api.load_model(EXAMPLES / "sage.gnn")
    sampling = SamplingConfig((10, 5), 256)
    cpu = api.run(model, graph, epochs=3, seed=0, sampling=sampling)
    gpu = api.run(model, graph, epochs=3, seed=0, sampling=sampling, device="cuda")
    assert rel(gpu.logits, cpu.logits) < 1e-3  # three Adam steps per epoch on sums in another order


@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs")
def test_gnnc_run_on_two_gpus(tmp_path) -> None:
    graph = api.load_graph("planetoid:cora")
    model = api.load_model(EXAMPLES / "gcn.gnn")
    one = api.run(model, graph, epochs=50, seed=0, device="cuda")
    two = api.run(model, "planetoid:cora", epochs=50, seed=0, nproc=2, strategy="depcomm", device="cuda")
    assert two.world_size == 2 and abs(two.test_acc - one.test_acc) <= 0.01


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_16_bit_trains_cora_gcn_within_a_point_of_fp32(precision: str) -> None:
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16")
    graph = api.load_graph("planetoid:cora")
    model = api.load_model(EXAMPLES / "gcn.gnn")
    accs = {p: sum(api.run(model, graph, seed=s, device="cuda", precision=p).test_acc for s in range(3)) / 3
            for p in ("fp32", precision)}
    assert abs(accs[precision] - accs["fp32"]) <= 0.01, accs


@pytest.mark.parametrize("op", ["spmm", "sddmm", "edge_softmax"])
def test_triton_kernels_on_cuda_against_float64(op: str) -> None:
    """The optional Triton kernels (gnnc[triton]) on the GPU, forward and backward, against the float64 reference."""
    pytest.importorskip("triton")
    from gnnc.runtime.kernels import reference as ref
    from gnnc.runtime.kernels import triton_kernels as tk
    from test_kernels import compare, make_csr

    csr = make_csr("hub", seed=41)
    gen = torch.Generator().manual_seed(42)
    if op == "spmm":
        x = torch.randn(csr.n_src, 3, 8, generator=gen).cuda()
        w = torch.rand(csr.nnz, 3, generator=gen).cuda()
        compare(lambda x, w: tk.spmm(csr, x, w, "sum"), lambda x, w: ref.spmm(csr, x, w, "sum"), [x, w])
    elif op == "sddmm":
        a = torch.randn(csr.n_src, 3, 8, generator=gen).cuda()
        b = torch.randn(csr.n_dst, 3, 8, generator=gen).cuda()
        compare(lambda a, b: tk.sddmm(csr, a, b, "dot"), lambda a, b: ref.sddmm(csr, a, b, "dot"), [a, b])
    else:
        e = torch.randn(csr.nnz, 3, generator=gen).cuda() * 10
        compare(lambda e: tk.edge_softmax(csr, e), lambda e: ref.edge_softmax(csr, e), [e])


def test_dropout_on_cuda_draws_the_cpus_mask() -> None:
    """rng.dropout on CUDA (the Triton kernel where triton imports, else torch's integer ops) applies the bits the
    CPU's compiled dropout applies, forward and backward: a distributed run on GPUs drops what one CPU process
    drops."""
    from gnnc.runtime import kernels, rng

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3000, 77, generator=gen)
    rows = torch.randperm(100_000, generator=gen)[:3000]
    g = torch.randn(3000, 77, generator=gen)
    expect = rng.dropout(x, 1234, rows, 0.35, col_offset=3)
    xc = x.cuda().requires_grad_(True)
    out = rng.dropout(xc, 1234, rows.cuda(), 0.35, col_offset=3)
    out.backward(g.cuda())
    assert torch.equal(out.detach().cpu(), expect)
    assert torch.equal(xc.grad.cpu(), g * rng.dropout_mask(1234, rows, (77,), 0.35, col_offset=3))
    if importlib.util.find_spec("triton") is not None:
        assert kernels.dropout_backend(xc) is not None  # the fused kernel is what ran
