"""`gnnc probe` measures this machine and writes a profile the planner can load."""
from __future__ import annotations

import subprocess
import sys

from conftest import ROOT
from gnnc.cluster import load_cluster


def test_probe_writes_a_loadable_profile(tmp_path) -> None:
    out = tmp_path / "probe.json"
    r = subprocess.run([sys.executable, "-m", "gnnc", "probe", "-o", str(out)], capture_output=True, text=True,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    profile = load_cluster(str(out))
    assert profile.name == "local"
    for field in ("gemm_rate", "spmm_rate", "memory_bandwidth", "intra_bandwidth"):
        assert getattr(profile, field) > 1e6, field
    assert 0 < profile.latency < 1.0
