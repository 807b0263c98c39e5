"""Analyses: facts the planner and the cost model read off the IR, the graph and the partition.

The bottom sub-layer of gnnc.passes (docs/architecture.md; tests/test_layering.py
enforces it): modules here import the core layers and each other only, never the
cost model, a planner or a pass. `layers`: the graph layers' widths and heads and
the values that depend on a parameter; `legality`: which strategies a layer may
run and where a segment may start; `sampled_stats`: the seeded dry run of the
neighbour sampler. The partitioners (gnnc.passes.partition) and the pass context
with its analysis cache (gnnc.passes.context) sit in this sub-layer too.
"""
