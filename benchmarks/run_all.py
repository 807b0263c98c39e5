"""Run every benchmark in turn (what `make bench` runs after the slow tests)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = ["vs_pyg.py", "kernels.py", "partition.py", "distributed.py", "prediction.py", "hoist.py", "sampling.py"]


def main() -> int:
    status = 0
    for name in BENCHMARKS:
        path = HERE / name
        print(f"\n=== {name} ===", flush=True)
        status |= subprocess.run([sys.executable, str(path)]).returncode
    return status


if __name__ == "__main__":
    sys.exit(main())
