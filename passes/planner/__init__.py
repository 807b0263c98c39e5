"""Planners: the searches that choose how a program runs, by the cost model's predictions.

The third sub-layer of gnnc.passes (docs/architecture.md; tests/test_layering.py
enforces it): modules here import the cost model (gnnc.passes.cost), the
analyses (gnnc.passes.analysis, gnnc.passes.partition, gnnc.passes.context)
and the core layers, never a pass module. `search`: choose-strategy's search
over segments (`segment_dp`, the pure DP it runs; `report`, the record it
answers with); `hybrid`: a hybrid segment's selection (`hybrid_greedy`,
NeutronStar's Algorithm 4); `pipeline`: GNNPipe's stages, chunks and groups;
`sampled`: P3's question for sampled minibatches.
"""
