"""The user cost function changes the planner's choice and shows in --explain."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def compile_explain(*extra: str) -> str:
    r = subprocess.run([sys.executable, "-m", "gnnc", "compile", "examples/gcn.gnn", "--graph", "planetoid:cora",
                        "--workers", "4", "--cluster", "neutronstar-ibv", "--allow", "depcomm,bcast1d", "--explain",
                        *extra], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_user_cost_function_is_used_and_named() -> None:
    plain = compile_explain()
    slow = compile_explain("--plugin", "examples/extending/slow_network.py")
    assert "user cost" not in plain
    assert "(user cost: depcomm: slow_network.depcomm_on_a_slow_network)" in slow
    chosen = [line for line in slow.splitlines() if "<- chosen" in line][0]
    assert "depcomm,depcomm" not in chosen
