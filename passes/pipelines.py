"""The default pass pipelines, by name.

A module of its own so that the command line can state them (`gnnc compile
--help`) without importing the pass manager, which loads the IR and sympy;
`gnnc.passes.manager` re-exports both lists.
"""
from __future__ import annotations

# sink-bias after reorder-gemm: reorder-gemm leaves the bias of a moved map as a `bias` op, which it then sinks
DEFAULT_PIPELINE: list[str] = ["infer-shapes", "check", "lower", "reorder-gemm", "sink-bias", "hoist"]
# after the default pipeline when compiling for several workers; hoist again to mark the exchanges of hoisted values
# schedule last: it decides how what the passes before it placed runs (overlap, stages, bins, buckets)
DISTRIBUTED_PIPELINE: list[str] = ["choose-strategy", "assign-strategy", "select-hybrid", "stage-pipeline",
                                   "insert-comm", "hoist", "predict-bytes", "schedule"]
