"""The default pass pipelines, by name.

A module of its own so that the command line can state them (`gnnc compile
--help`) without importing the pass manager, which loads the IR and sympy;
`gnnc.passes.manager` re-exports both lists.
"""
from __future__ import annotations

# sink-bias after reorder-gemm: reorder-gemm leaves the bias of a moved map as a `bias` op, which it then sinks
DEFAULT_PIPELINE: list[str] = ["infer-shapes", "check", "lower", "reorder-gemm", "sink-bias"]
# after the default pipeline when compiling for several workers
DISTRIBUTED_PIPELINE: list[str] = ["choose-strategy", "assign-strategy", "select-hybrid", "insert-comm",
                                   "predict-bytes"]
