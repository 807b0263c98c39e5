"""gnnc.plan: what a compiled plan holds and how it is stored.

The row-set model (`rows`: which worker holds which rows, layer by layer,
and each worker's local structure), P3's feature slices (`slices`), halo
plans (`halo`), the strategies' descriptors (`strategies`) and the shard
files every rank loads (`shards`, `shard_files`). Passes (which predict
bytes from the row sets) and the runtime (which executes them) both stand
on it; it imports only the IR, the graph and gnnc's errors.
"""
