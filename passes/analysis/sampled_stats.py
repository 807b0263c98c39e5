"""A seeded dry run of the neighbour sampler: what each worker's minibatches hold, summed over an epoch.

Why this module exists: the sampled strategies' costs depend on how many
vertices and edges the blocks hold and how many of the first block's sources
live elsewhere, which depend on the fan-outs, the degree distribution and
the partition together. Rather than estimate them, the planner samples one
epoch exactly as the run will (the same seed, batches and per-worker seeds;
the sampler is counter-based, so the run draws the same blocks), so the
predicted bytes of that epoch equal the measured ones, and the other epochs'
differ only by sampling noise. A worker samples the seeds of each global
batch that it owns.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnnc.graph.sampling import NeighbourSampler, SamplingConfig, packed_size, reads_edge_ids
from gnnc.ir import Program
from gnnc.passes.context import PassContext


@dataclass(frozen=True)
class SampledStats:
    """Per worker (rows) and graph layer (columns, first layer first), summed over one epoch's minibatches.

    sources, destinations, edges: the blocks' vertex and edge counts.
    pulled: sources of the first block owned by another worker (dp-sample fetches their features).
    served: rows the other workers pull from this one.
    packed: int64 entries of the first blocks as pushed (gnnc.graph.sampling.packed_size; push-pull).
    batches: minibatches in the epoch; seeds: seeds per worker.
    """

    batches: int
    seeds: np.ndarray
    sources: np.ndarray
    destinations: np.ndarray
    edges: np.ndarray
    pulled: np.ndarray
    served: np.ndarray
    packed: np.ndarray

    @classmethod
    def compute(cls, program: Program, ctx: PassContext) -> "SampledStats":
        return dry_run(program, ctx.graph, ctx.parts, ctx.workers, ctx.sampling, ctx.seed)


def dry_run(program: Program, graph, parts: np.ndarray, world: int, sampling: SamplingConfig, seed: int,
            epoch: int = 0) -> SampledStats:
    """Sample epoch `epoch` as every worker of a run will, and count what it holds."""
    layers = program.graph_layers()
    sampler = NeighbourSampler(graph, [layer.edges for layer in layers], sampling.layer_fanouts(len(layers)), seed)
    edge_ids = reads_edge_ids(layers[0])
    train = np.nonzero(graph.train_mask.numpy())[0]
    batches = sampler.epoch_batches(epoch, train, sampling.batch_size)
    shape = (world, len(layers))
    src, dst, edges = np.zeros(shape, np.int64), np.zeros(shape, np.int64), np.zeros(shape, np.int64)
    pulled, served, packed, seeds = (np.zeros(world, np.int64) for _ in range(4))
    for index, batch in enumerate(batches):
        for rank in range(world):
            mine = batch[parts[batch] == rank]
            mb = sampler.sample(mine, epoch, index)
            seeds[rank] += len(mine)
            for k, block in enumerate(mb.blocks):
                src[rank, k] += block.n_src
                dst[rank, k] += block.n_dst
                edges[rank, k] += block.nnz
            owners = parts[mb.blocks[0].src_ids]
            remote = owners[owners != rank]
            pulled[rank] += len(remote)
            served += np.bincount(remote, minlength=world)
            first = mb.blocks[0]
            packed[rank] += packed_size(first.n_src, first.n_dst, first.nnz, edge_ids)
    return SampledStats(len(batches), seeds, src, dst, edges, pulled, served, packed)
