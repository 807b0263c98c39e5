"""`--device cpu|cuda|auto`: parsed once, refused in one line where it cannot run, the same on every rank.

What a machine without a GPU can show: `--device cuda` exits 2 with one line (run, probe, the benchmarks),
`auto` falls back to the CPU, a compile for a GPU elsewhere still works and reads that device's probe, a
job whose ranks would run on different devices is refused before its process group forms, and
`make gpu-check` stops at once naming the missing device. What a GPU shows is in tests/test_gpu.py.
"""
from __future__ import annotations

import runpy
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from conftest import EXAMPLES, ROOT, random_graph
from gnnc import api
from gnnc.cli import main
from gnnc.cluster import ClusterProfile, default_probe_file, resolve_cluster
from gnnc.errors import GnncError
from gnnc.runtime import device as devices
from gnnc.runtime.launch import DistConfig, LaunchError, _check_same_device, init_distributed
from gnnc.runtime.probe import gpu_fields

NO_GPU = not torch.cuda.is_available()
needs_no_gpu = pytest.mark.skipif(not NO_GPU, reason="checks what happens without a GPU")


def gnnc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gnnc", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


@needs_no_gpu
def test_cuda_without_a_gpu_is_one_line_and_exit_2() -> None:
    r = gnnc("run", str(EXAMPLES / "gcn.gnn"), "--graph", "planetoid:cora", "--device", "cuda")
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == ["error: --device cuda: no CUDA device (this torch "
                                     f"({torch.__version__}) is built without CUDA); use --device cpu or auto"]
    assert r.stdout == ""


@needs_no_gpu
@pytest.mark.parametrize("argv", [["run", str(EXAMPLES / "gcn.gnn"), "--graph", "planetoid:cora", "--device", "cuda",
                                   "--nproc", "2"],
                                  ["probe", "--device", "cuda"]])
def test_every_command_refuses_cuda_without_a_gpu_the_same_way(argv: list[str], capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("error: --device cuda: no CUDA device"), err


@needs_no_gpu
@pytest.mark.parametrize("script", ["vs_pyg.py", "kernels.py", "distributed.py", "prediction.py", "gnnpipe.py",
                                    "minibatch.py --section accuracy"])
def test_the_benchmarks_refuse_cuda_without_a_gpu(script: str, monkeypatch, capsys) -> None:
    script, *args = script.split()
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.setattr(sys, "argv", [script, *args, "--device", "cuda"])
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(ROOT / "benchmarks" / script), run_name="__main__")
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "no CUDA device" in err, err


def test_devices_resolve_once() -> None:
    assert devices.resolve_device("cpu") == "cpu"
    assert devices.resolve_device("auto") == ("cpu" if NO_GPU else "cuda")
    assert devices.resolve_device("cuda", here=False) == "cuda"  # compiling for a GPU elsewhere
    with pytest.raises(devices.DeviceError, match="unknown device 'gpu'"):
        devices.resolve_device("gpu")
    assert devices.rank_device("cuda", 3) == torch.device("cuda", 3)
    assert devices.rank_device("cpu", 3) == torch.device("cpu")
    t = torch.ones(3)
    assert devices.mover(torch.device("cpu"))(t) is t  # a CPU run moves nothing


def test_unknown_device_on_the_command_line(capsys) -> None:
    assert main(["run", str(EXAMPLES / "gcn.gnn"), "--graph", "planetoid:cora", "--device", "tpu"]) == 2
    assert capsys.readouterr().err.strip() == "error: unknown device 'tpu' (known: cpu, cuda, auto)"


@needs_no_gpu
def test_gpu_ranks_need_a_gpu_each() -> None:
    with pytest.raises(devices.DeviceError, match="--nproc 2 on CUDA needs 2 GPUs"):
        devices.check_gpu_count(2)
    cfg = DistConfig(rank=0, world_size=1, local_rank=0, master_addr="127.0.0.1", master_port=1, device="cuda")
    assert cfg.backend == "nccl"
    with pytest.raises(LaunchError, match="asks for CUDA but this machine has no usable GPU"):
        init_distributed(cfg)


def test_a_job_mixing_devices_is_refused_before_its_group_forms() -> None:
    store = dist.HashStore()
    store.set("gnnc/device/1", "cuda")  # what the other rank, on a machine with a GPU, announced
    cfg = DistConfig(rank=0, world_size=2, local_rank=0, master_addr="127.0.0.1", master_port=1, device="cpu")
    with pytest.raises(LaunchError, match=r"the job mixes devices \(cpu: ranks \[0\]; cuda: ranks \[1\]\): every "
                                          r"rank must run on the same device"):
        _check_same_device(store, cfg)
    same = dist.HashStore()
    same.set("gnnc/device/1", "cpu")
    _check_same_device(same, cfg)  # agreeing ranks pass


def test_the_gpu_probe_makes_a_profile_the_planner_reads(tmp_path, monkeypatch) -> None:
    """`gnnc probe --device cuda` writes the GPUs' figures to the CUDA probe file, which `gnnc compile
    --device cuda --cluster local` prices with (the measuring itself needs a GPU: tests/test_gpu.py, make gpu-check)."""
    fields = gpu_fields(name="NVIDIA Test", count=2, memory=80 * 2**30, latency=1e-5, bandwidth=1e11,
                        memory_bandwidth=2e12, fp32=5e13, bf16=7e14, fp16=7e14, spmm=4e11, spmm_16=8e11)
    profile = ClusterProfile.from_dict(fields, "probe")
    assert profile.workers == 2 and profile.rates_at("bf16") == (7e14, 8e11)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    path = tmp_path / "gnnc" / "probe-cuda.json"
    assert default_probe_file("cuda") == path and default_probe_file().name == "probe.json"
    graph = random_graph(n=60, e=300, f=8, c=3, seed=2)
    model = api.load_model(EXAMPLES / "gcn.gnn")
    with pytest.raises(GnncError, match=f"measured by `gnnc probe --device cuda`, and {path} does not exist"):
        api.compile(model, graph, workers=2, cluster="local", device="cuda")
    path.parent.mkdir(parents=True)
    profile.save(path)
    assert resolve_cluster("local", "cuda").description.startswith("this machine's 2 x NVIDIA Test")
    plan = api.compile(model, graph, workers=2, cluster="local", device="cuda", precision="bf16")
    assert plan.meta.planner.predicted_time_s > 0


@needs_no_gpu
def test_make_gpu_check_stops_at_once_without_a_gpu(tmp_path) -> None:
    r = subprocess.run(["make", "-s", "gpu-check", "GPU_VENV=" + str(tmp_path / "venv")], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    assert r.returncode != 0
    assert r.stderr.splitlines()[0].startswith("make gpu-check: no CUDA device"), r.stderr
    assert not (tmp_path / "venv").exists()  # nothing installed, nothing half run


def test_what_stays_on_the_cpu_or_in_fp32_says_so_in_one_line(capsys) -> None:
    """Sampled minibatches on several workers keep their blocks and control messages on the host; the
    pipeline and sampled minibatches run in fp32; the network probe measures gloo links. Each refuses the
    device or precision it does not run in by name, before anything starts."""
    from gnnc.graph.sampling import SamplingConfig
    from gnnc.runtime.train import TrainConfig

    graph = random_graph(n=40, e=160, f=8, c=3, seed=1)
    sage = api.load_model(EXAMPLES / "sage.gnn")
    plan = api.compile(sage, graph, workers=2, sampling=SamplingConfig((3, 2), 8))
    with pytest.raises(GnncError, match=r"^--device cuda: sampled minibatch training on several workers "
                                        r"\(--fanout with --nproc 2\) runs on the CPU for now"):
        api.run_plan(plan, graph, TrainConfig(progress=False, device="cuda"))
    with pytest.raises(GnncError, match=r"^--precision bf16: sampled minibatch training \(--fanout\) runs in fp32"):
        api.compile(sage, graph, workers=1, sampling=SamplingConfig((3, 2), 8), precision="bf16")
    deep = api.load_model(EXAMPLES / "gcnii.gnn", layers=4)
    with pytest.raises(GnncError, match=r"^--precision bf16: GNNPipe's pipeline runs in fp32 for now"):
        api.compile(deep, graph, workers=2, strategy="pipeline", approximate=True, precision="bf16")
    # the planner prices it beside the exact strategies at fp32 only, so --approximate still plans at 16 bits
    priced = {p: {s for alt in api.compile(deep, graph, workers=2, approximate=True, precision=p)
                  .meta.planner.alternatives for s in alt["strategies"]} for p in ("fp32", "bf16")}
    assert "pipeline" in priced["fp32"] and "pipeline" not in priced["bf16"]
    if NO_GPU:  # --device cuda is refused for the missing GPU first
        return
    assert main(["probe", "--network", "--device", "cuda"]) == 2
    assert capsys.readouterr().err.startswith("error: --network measures the links between CPU ranks with gloo")
