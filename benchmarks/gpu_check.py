"""The GPU benchmarks of issue 15, run in one go and written to benchmarks/RESULTS-gpu.md (`make gpu-check`).

1. SpMM at widths 32/64/128/256 on a 200K-vertex / 2M-edge uniform random graph and on a
   products-scale one (2.4M vertices, 62M edges): gnnc's default path (cuSPARSE) no slower than
   torch.sparse in the same run; the optional Triton kernels timed beside it, op by op (SpMM,
   SDDMM-dot, edge softmax), which is what `gnnc.runtime.kernels.TRITON_OPS` is set from.
2. 200K/2M, F=128, hidden 128: GCN and SAGE epochs at least 4x faster than PyG's in the same run,
   GAT (8 heads) at least 3x.
3. Products scale (F=100, hidden 256, 47 classes): GCN, SAGE and GAT train full-graph on one GPU
   (PyG's rows say whether it ran out of memory); the GCN epoch at most 70 ms.

Each benchmark runs in its own process (benchmarks/kernels.py, benchmarks/vs_pyg.py, with `--json`);
the file records the GPU, the driver, torch, the commands and every figure, and says for each target
whether it was met. Nothing here is tuned to a target: a miss is written down as a miss.

    python benchmarks/gpu_check.py -o benchmarks/RESULTS-gpu.md
    python benchmarks/gpu_check.py --quick -o /tmp/r.md     # small graphs: checks the script, not the targets
    python benchmarks/gpu_check.py --sections 2,3            # the epochs only (a short device lease)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from device_arg import add_device_argument, resolve_device_or_exit

HERE = Path(__file__).resolve().parent
SMALL = {"n": 200_000, "m": 2_000_000}
PRODUCTS = {"n": 2_400_000, "m": 62_000_000}


def sh(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def bench(script: str, args: list[str], timeout: int) -> tuple[dict | None, str, str]:
    """Run benchmarks/SCRIPT ARGS --json; (its rows or None, the command, its output or error)."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "rows.json"
        cmd = [sys.executable, str(HERE / script), *args, "--json", str(out)]
        shown = " ".join(["python", f"benchmarks/{script}", *args])
        print(f"$ {shown}", flush=True)
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, shown, f"timed out after {timeout} s"
        print(r.stdout, end="", flush=True)
        if r.returncode != 0 or not out.exists():
            return None, shown, (r.stderr.strip().splitlines() or ["failed"])[-1]
        return json.loads(out.read_text()), shown, r.stdout


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**missed**")


def spmm_section(device: str, name: str, size: dict, quick: bool, with_pyg: bool, lines: list[str],
                 triton_wins: dict[str, list[bool]]) -> None:
    args = ["--device", device, "--n", str(size["n"]), "--m", str(size["m"]), "--widths", "32,64,128,256",
            "--repeat", "3" if quick else "5"] + ([] if with_pyg else ["--no-pyg"])
    data, cmd, text = bench("kernels.py", args, timeout=3600)
    lines += [f"### SpMM, {name}: {size['n']:,} vertices, {size['m']:,} edges", "", f"`{cmd}`", ""]
    if data is None:
        lines += [f"failed: {text}", ""]
        return
    lines += ["| width | gnnc fwd+bwd s | torch.sparse fwd+bwd s | gnnc-triton fwd+bwd s | PyG fwd+bwd s | "
              "gnnc no slower than torch.sparse |", "|---|---|---|---|---|---|"]
    for row in data["rows"][device]:
        if row["width"] in ("sddmm dot", "edge_softmax", "dropout"):
            triton_wins.setdefault(row["width"].split()[0], []).append(row["triton fwd+bwd"] < row["torch fwd+bwd"])
            continue
        ours, torch_s = row.get("gnnc fwd+bwd"), row.get("torch.sparse fwd+bwd")
        tri, pyg = row.get("gnnc-triton fwd+bwd"), row.get("pyg fwd+bwd")
        if tri is not None:
            triton_wins.setdefault("spmm", []).append(tri < ours)
        ok = None if torch_s is None else (ours <= torch_s and row["gnnc fwd"] <= row["torch.sparse fwd"])
        fmt = lambda t: "-" if t is None else f"{t:.4f}"  # noqa: E731
        lines.append(f"| {row['width']} | {fmt(ours)} | {fmt(torch_s)} | {fmt(tri)} | {fmt(pyg)} | {verdict(ok)} |")
    attention = [r for r in data["rows"][device] if r["width"] in ("sddmm dot", "edge_softmax", "dropout")]
    if attention:
        lines += ["", "| kernel (GAT's: 8x16; dropout: [n, 128]) | torch fwd+bwd s | triton fwd+bwd s |", "|---|---|---|"]
        lines += [f"| {r['width']} | {r['torch fwd+bwd']:.4f} | {r['triton fwd+bwd']:.4f} |" for r in attention]
    lines.append("")


def epoch_section(device: str, title: str, args: list[str], targets: dict[str, float] | None,
                  gcn_limit_s: float | None, lines: list[str]) -> None:
    data, cmd, text = bench("vs_pyg.py", ["--device", device, *args], timeout=5400)
    lines += [f"### {title}", "", f"`{cmd}`", ""]
    if data is None:
        lines += [f"failed: {text}", ""]
        return
    rows = {(r["system"], r["model"]): r for r in data["rows"]}
    lines += ["| model | gnnc s/epoch | PyG s/epoch | speed-up | gnnc peak GiB | PyG | target | |",
              "|---|---|---|---|---|---|---|---|"]
    for model in data["args"]["models"].split(","):
        g, p = rows.get(("gnnc", model), {}), rows.get(("pyg", model), {})
        if "error" in g or not g:
            lines.append(f"| {model} | failed: {g.get('error', '?')} | | | | | | **missed** |")
            continue
        pyg = f"{p['epoch_s']:.4f}" if p and "error" not in p else f"failed: {p.get('error', '?')[:80]}"
        speedup = p["epoch_s"] / g["epoch_s"] if p and "error" not in p else None
        want = (targets or {}).get(model)
        ok = None if want is None or speedup is None else speedup >= want
        target = f">= {want:g}x" if want else ""
        if gcn_limit_s is not None and model == "gcn":
            target, ok = f"<= {gcn_limit_s * 1000:g} ms", g["epoch_s"] <= gcn_limit_s
        elif gcn_limit_s is not None:
            target, ok = "trains", True
        lines.append(f"| {model} | {g['epoch_s']:.4f} | {pyg} | {'-' if speedup is None else f'{speedup:.1f}x'} | "
                     f"{g['peak_bytes'] / 2**30:.1f} | {'ran' if p and 'error' not in p else 'did not run'} | "
                     f"{target} | {verdict(ok)} |")
    lines.append("")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=str(HERE / "RESULTS-gpu.md"))
    ap.add_argument("--quick", action="store_true", help="small graphs and few epochs: checks the script only")
    ap.add_argument("--sections", default="1,2,3", help="which of the three sections to run (default: all)")
    add_device_argument(ap, default="cuda")
    args = ap.parse_args()
    sections = {int(x) for x in args.sections.split(",")}
    device = resolve_device_or_exit(args.device)  # cpu: the same tables on the CPU (to check this script)
    import torch

    small, products = SMALL, PRODUCTS
    if args.quick:
        small, products = {"n": 20_000, "m": 200_000}, {"n": 50_000, "m": 500_000}
    epochs = ["--epochs", "3", "--warmup", "1"] if args.quick else ["--epochs", "10", "--warmup", "3"]
    flags = (" --quick" if args.quick else "") + ("" if device == "cuda" else f" --device {device}") + (
        f" --sections {args.sections}" if sections != {1, 2, 3} else "")
    lines = ["# gnnc on a GPU: issue 15's benchmarks", "",
             f"Written by `make gpu-check` (benchmarks/gpu_check.py{flags}) on "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", ""]
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        driver = (sh(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) or "?").splitlines()[0]
        lines.append(f"- GPU: {torch.cuda.device_count()} x {props.name}, {props.total_memory / 2**30:.0f} GiB "
                     f"(driver {driver})")
    else:
        lines.append("- **no GPU: these are CPU figures, which check this script, not the issue's targets**")
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"
    lines += [f"- torch {torch.__version__} (CUDA {torch.version.cuda}), triton {_version('triton')}, "
              f"torch_geometric {_version('torch_geometric')}",
              f"- load average at the start: {load}; {os.cpu_count()} CPU cores", ""]
    if args.quick:
        lines += ["**--quick: small graphs; the targets below are not what the issue asks.**", ""]
    out = Path(args.output)

    def save() -> None:
        # after every section: a run stopped by a time limit still leaves what it measured
        out.write_text("\n".join(lines) + "\n")

    lines += ["## 1. SpMM", ""]
    if 1 in sections:
        wins: dict[str, list[bool]] = {}
        spmm_section(device, "uniform", small, args.quick, True, lines, wins)
        save()
        spmm_section(device, "products scale", products, args.quick, False, lines, wins)  # PyG's [nnz, F]: too big
        faster = sorted(op for op, w in wins.items() if w and all(w))
        lines += [f"Triton faster than torch's path at every size measured: {', '.join(faster) or 'no op'} "
                  f"(gnnc.runtime.kernels.TRITON_OPS should name {'these' if faster else 'none'}; it names "
                  f"{sorted(_triton_ops()) or 'none'}).", ""]
    else:
        lines += ["Not run (--sections).", ""]
    save()
    lines += ["## 2. Epochs against PyG", ""]
    g = ["--n", str(small["n"]), "--m", str(small["m"]), "--features", "128", "--hidden", "128", "--heads", "8"]
    if 2 in sections:
        epoch_section(device, f"{small['n']:,} vertices, {small['m']:,} edges, F=128, hidden 128", g + epochs,
                      {"gcn": 4.0, "sage": 4.0, "gat": 3.0}, None, lines)
    else:
        lines += ["Not run (--sections).", ""]
    save()
    p = ["--n", str(products["n"]), "--m", str(products["m"]), "--features", "100", "--hidden", "256",
         "--classes", "47", "--heads", "8"]
    lines += ["## 3. Products scale, full graph", ""]
    if 3 in sections:
        epoch_section(device, f"{products['n']:,} vertices, {products['m']:,} edges, F=100, hidden 256, 47 classes",
                      p + epochs, None, 0.070, lines)
    else:
        lines += ["Not run (--sections).", ""]
    save()
    print(f"wrote {args.output}")


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except ImportError:
        return "not installed"


def _triton_ops() -> frozenset[str]:
    from gnnc.runtime.kernels import TRITON_OPS  # deferred: loads torch

    return TRITON_OPS


if __name__ == "__main__":
    main()
