"""GNNPipe's pipeline as a plan: the stage annotations, the values crossing stages, each rank's chunks.

Why this module exists: the `stage-pipeline` pass decides the stages, the
chunk count, the group size and how often the history is refreshed, the
runtime (gnnc.runtime.pipeline) executes exactly that, and predict-bytes
counts what it sends; all three read the decisions and derive the chunk
structures here, so they cannot drift.

The annotations (IR attributes, written by `annotate`, read by `schedule_of`):
* every layer of the program: `stage=s`, the pipeline stage that runs it
  (stage 0 holds the dense layers before the first graph layer; a stage
  starts at a graph layer and ends before the next stage's first one);
* every graph layer: `chunks=K`, `groups=G` (workers per stage, running the
  stage graph-parallel), `history_every=alpha` (epochs between refreshes),
  `chunk_history=true|false` (the setting history_update, HISTORY_UPDATES:
  false for "refresh", the rows not yet processed read from the last
  refresh, GNNPipe's trick 3 as published; true for "chunk", from the
  previous epoch) and `shuffle_chunks=true|false` (GNNPipe's trick 1: a new chunk
  order every epoch; false only to measure the trick);
* the first layer of every stage s >= 1: `pipe_grad=true|false`, whether
  the values it receives carry a gradient back (some depend on a parameter).

The partition of a pipeline plan is its chunking: `parts[v] = k*G + g` puts
vertex v in chunk k, computed by group member g (GNNPipe splits each chunk
into G sub-chunks). Rank r is member r % G of stage r // G; member g of
every stage computes the same rows, so stage s's member g sends its rows of
each chunk to stage s+1's member g.

A chunk's layer reads, for each neighbour u of its vertices: u's current
row when u is in the chunk (held, or fetched from a group peer), else u's
row in the history (`history` op, no gradient). Columns of a chunk's
structure: its own rows first, then the chunk's peer rows (by owner, then
global id), then the out-of-chunk rows (by global id).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from gnnc.errors import PlanError
from gnnc.graph import CSR, Graph, GraphView, sorted_unique
from gnnc.ir import Layer, Program, Value
from gnnc.ir.dims import eval_dim
from gnnc.plan.halo import HaloPlan

STRATEGY = "pipeline"
HISTORY_EVERY = 23  # GNNPipe's alpha: epochs between refreshes of the history (its section 3.2.4)
CHUNKS_PER_STAGE = 4  # GNNPipe's K = 4 M (M workers, one stage each)
# Where a chunk's layer reads the neighbours no chunk has processed yet this epoch (those processed are read
# current in both: each chunk's rows overwrite the history as it passes, GNNPipe's Algorithm 1). "refresh" (the
# default): from the last refresh, every epoch of a window of alpha the same rows, GNNPipe's trick 3 (its section
# 3.2.4: epoch t reads the embeddings of epoch alpha*floor((t-1)/alpha), "consecutive epochs observe consistent
# historical embeddings"); each epoch starts from the refresh's history. "chunk": from the previous epoch (the most
# recent rows, what the chunks left; gnnc's rule before). Both move and compute the same. gnnc's refresh is a full
# pass at the start of the window's first epoch with that epoch's weights and dropout masks, where GNNPipe keeps
# the rows its pipeline computed in that epoch.
HISTORY_UPDATES = ("refresh", "chunk")
HISTORY_UPDATE = "refresh"


@dataclass(frozen=True)
class PipelineSchedule:
    """The pipeline a program runs (see the module docstring for each field's attribute).

    stage_of: the stage of every layer of `program.layers`, in order.
    pipe_grad: per stage s >= 1 (index s - 1), whether its received values send a gradient back.
    """

    stages: int
    groups: int
    chunks: int
    history_every: int
    stage_of: tuple[int, ...]
    pipe_grad: tuple[bool, ...]
    history_update: str = HISTORY_UPDATE
    shuffle_chunks: bool = True

    @property
    def workers(self) -> int:
        return self.stages * self.groups

    def stage_of_rank(self, rank: int) -> int:
        return rank // self.groups

    def member_of_rank(self, rank: int) -> int:
        return rank % self.groups

    def layers(self, program: Program, stage: int) -> list[Layer]:
        return [layer for layer, s in zip(program.layers, self.stage_of) if s == stage]


def is_pipeline(program: Program) -> bool:
    """Whether the program's graph layers run the pipeline strategy."""
    return any(layer.attr("strategy") == STRATEGY for layer in program.graph_layers())


def schedule_of(program: Program) -> PipelineSchedule | None:
    """The pipeline of an annotated program; None when it runs no pipeline. Malformed: PlanError."""
    graph_layers = program.graph_layers()
    if not is_pipeline(program):
        return None
    if any(layer.attr("strategy") != STRATEGY for layer in graph_layers):
        raise PlanError("a pipeline runs every graph layer: the plan mixes 'pipeline' with other strategies")
    facts = {key: {layer.attr(key) for layer in graph_layers} for key in ("chunks", "groups", "history_every")}
    for key, values in facts.items():
        if len(values) != 1 or not isinstance(next(iter(values)), int) or next(iter(values)) < 1:
            raise PlanError(f"pipeline: every graph layer needs the same positive integer '{key}', found "
                            f"{sorted(map(str, values))}")
    stage_of = tuple(layer.attr("stage") for layer in program.layers)
    if any(not isinstance(s, int) or isinstance(s, bool) for s in stage_of) or stage_of[0] != 0 \
            or any(b - a not in (0, 1) for a, b in zip(stage_of, stage_of[1:])):
        raise PlanError(f"pipeline: layer stages must start at 0 and grow by one at a time, found {list(stage_of)}")
    stages = stage_of[-1] + 1
    starts = [k for k in range(1, len(stage_of)) if stage_of[k] != stage_of[k - 1]]
    if any(program.layers[k].kind != "graph" for k in starts):
        raise PlanError("pipeline: every stage after the first must start at a graph layer")
    grads = tuple(program.layers[k].attr("pipe_grad") for k in starts)
    if any(not isinstance(g, bool) for g in grads):
        raise PlanError("pipeline: the first layer of every stage after the first needs pipe_grad=true|false")
    chunks = next(iter(facts["chunks"]))
    groups = next(iter(facts["groups"]))
    flags = {}
    for key in ("chunk_history", "shuffle_chunks"):
        values = {layer.attr(key) for layer in graph_layers}
        if len(values) != 1 or not isinstance(next(iter(values)), bool):
            raise PlanError(f"pipeline: every graph layer needs the same {key}=true|false, found "
                            f"{sorted(map(str, values))} (a plan compiled before the setting: recompile it)")
        flags[key] = next(iter(values))
    return PipelineSchedule(stages, groups, chunks, next(iter(facts["history_every"])), stage_of, grads,
                            "chunk" if flags["chunk_history"] else "refresh", flags["shuffle_chunks"])


def annotate(program: Program, stage_of: list[int], chunks: int, groups: int, history_every: int,
             pipe_grad: list[bool], history_update: str = HISTORY_UPDATE, shuffle_chunks: bool = True) -> Program:
    """`program` with the pipeline's attributes (module docstring); the inverse of `schedule_of`."""
    if history_update not in HISTORY_UPDATES:
        raise ValueError(f"history_update must be one of {', '.join(HISTORY_UPDATES)}, got {history_update!r}")
    layers = []
    for k, (layer, s) in enumerate(zip(program.layers, stage_of)):
        attrs = dict(layer.attrs)
        attrs["stage"] = s
        if layer.kind == "graph":
            attrs.update(chunks=chunks, groups=groups, history_every=history_every,
                         chunk_history=history_update == "chunk", shuffle_chunks=shuffle_chunks)
        if k and s != stage_of[k - 1]:
            attrs["pipe_grad"] = pipe_grad[s - 1]
        layers.append(layer.replace(attrs=tuple(sorted(attrs.items()))))
    return program.replace(layers=tuple(layers))


def boundary_values(program: Program, stage_of: list[int] | tuple[int, ...], stage: int) -> list[Value]:
    """The values stage `stage` receives: produced by an earlier stage, read at this stage or a later one.

    Program inputs are static (every rank loads the rows it needs) and never cross. Ordered by the
    layer that produces them, then its outputs' order: sender and receiver agree.
    """
    produced: dict[str, tuple[int, int, Value]] = {}
    for k, layer in enumerate(program.layers):
        for j, v in enumerate(layer.outputs):
            produced.setdefault(v.name, (k, j, v))
    wanted: dict[str, tuple[int, int, Value]] = {}
    for layer, s in zip(program.layers, stage_of):
        if s < stage:
            continue
        for v in layer.inputs:
            source = produced.get(v.name)
            if source is not None and stage_of[source[0]] < stage:
                wanted[v.name] = source
    return [v for _, _, v in sorted(wanted.values(), key=lambda t: (t[0], t[1]))]


def value_width(program: Program, value: Value) -> int:
    """Elements per row of a vertex value (the product of its feature shape)."""
    cfg = program.config_dict()
    width = 1
    for d in value.type.shape:
        width *= eval_dim(d, cfg)
    return width


def boundary_width(program: Program, stage_of: list[int] | tuple[int, ...], stage: int) -> int:
    """Elements per row sent into `stage` (its boundary values side by side)."""
    return sum(value_width(program, v) for v in boundary_values(program, stage_of, stage))


def history_values(layer: Layer) -> list[Value]:
    """The values a pipeline layer reads through the history (inputs of its `history` ops)."""
    return [e.ins[0] for e in layer.eqns if e.op == "history"]


def reads_inputs(program: Program, layers: list[Layer]) -> set[str]:
    """The program inputs (x, y, masks) the given layers read."""
    names = {v.name for v in program.inputs}
    return {v.name for layer in layers for v in layer.inputs if v.name in names}


# --- each member's chunks --------------------------------------------------------------------------


def member_rows(parts: np.ndarray, chunks: int, groups: int, member: int) -> tuple[np.ndarray, np.ndarray]:
    """Member `member`'s rows in its order (chunk by chunk, global id inside a chunk) and chunk offsets [K+1]."""
    p = np.asarray(parts, dtype=np.int64)
    rows = [np.nonzero(p == k * groups + member)[0] for k in range(chunks)]
    ptr = np.zeros(chunks + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(r) for r in rows])
    return np.concatenate(rows).astype(np.int64), ptr


@dataclass
class ChunkStructure:
    """One chunk's structure as a member computes it over one edge view.

    view: the in-edges of the member's rows of the chunk; sources index [own rows; ext rows].
    ext_ids: global ids of the ext rows: first `n_peer` rows of the chunk owned by group peers
        (by owner, then id), then the out-of-chunk rows read from the history (by id).
    halo: the group exchange of the chunk's peer rows (None with one worker per stage).
    later: the group exchange, as the chunk passes, of its rows that peers read from their history
        in their other chunks (no gradient), `later_ids` the rows it brings here (by owner, then id);
        so a group's history follows the chunks as one worker's does. None with one worker per stage.
    """

    view: GraphView
    ext_ids: torch.Tensor
    n_peer: int
    halo: HaloPlan | None
    later: HaloPlan | None = None
    later_ids: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "ChunkStructure":
        """This chunk's structure with every tensor mapped by `fn` (copied to the run's device)."""
        return ChunkStructure(self.view.map_tensors(fn), fn(self.ext_ids), self.n_peer,
                              None if self.halo is None else self.halo.map_tensors(fn),
                              None if self.later is None else self.later.map_tensors(fn), fn(self.later_ids))


@dataclass
class MemberStructures:
    """Every chunk of one edge view for one member, and the refresh exchange of the full pass.

    refresh: the peer-owned rows among all ext rows (by owner, then id), fetched before each layer
        of a full pass (None with one worker per stage); refresh_ids: their global ids.
    """

    chunks: list[ChunkStructure]
    refresh: HaloPlan | None
    refresh_ids: torch.Tensor

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "MemberStructures":
        return MemberStructures([c.map_tensors(fn) for c in self.chunks],
                                None if self.refresh is None else self.refresh.map_tensors(fn), fn(self.refresh_ids))


def _chunk_view(graph: Graph, view: str, eids: np.ndarray, local_src: np.ndarray, local_dst: np.ndarray,
                n_dst: int, n_src: int) -> GraphView:
    csr = CSR.from_edges(local_src, local_dst, n_dst, n_src)
    global_eids = torch.as_tensor(eids, dtype=torch.int64)[csr.eids]
    return GraphView(csr, csr.indices, csr.dst_index(), global_eids, {"gcn_norm": graph.gcn_norm(view)[global_eids]},
                     csr.in_degree().to(torch.float32))


@dataclass
class _Lists:
    """Per (chunk, member) of one view: its in-edges and their sources, the chunk's peer rows it reads
    (by owner, then id), the out-of-chunk rows it reads from the history (by id), and the rows of the
    chunk its peers own that it reads from the history in its other chunks (by owner, then id)."""

    edges: dict[tuple[int, int], np.ndarray]
    sources: dict[tuple[int, int], np.ndarray]
    peer: dict[tuple[int, int], np.ndarray]
    hist: dict[tuple[int, int], np.ndarray]
    later: dict[tuple[int, int], np.ndarray]


def _by_owner(ids: np.ndarray, member_of: np.ndarray) -> np.ndarray:
    return ids[np.lexsort((ids, member_of[ids]))].astype(np.int64)


def _lists(graph: Graph, view: str, parts: np.ndarray, chunks: int, groups: int) -> _Lists:
    src, dst = graph.edges(view)
    chunk_of, member_of = parts // groups, parts % groups
    out = _Lists({}, {}, {}, {}, {})
    order = np.lexsort((dst, parts[dst]))  # edges grouped by the (chunk, member) of their destination
    bounds = np.searchsorted(parts[dst][order], np.arange(chunks * groups + 1))
    for k in range(chunks):
        for g in range(groups):
            part = k * groups + g
            e = order[bounds[part]:bounds[part + 1]]
            s = src[e]
            in_chunk = chunk_of[s] == k
            out.edges[(k, g)], out.sources[(k, g)] = e, s
            out.peer[(k, g)] = _by_owner(sorted_unique(s[in_chunk & (member_of[s] != g)]), member_of)
            out.hist[(k, g)] = sorted_unique(s[~in_chunk]).astype(np.int64)
    for g in range(groups):
        read = np.concatenate([out.hist[(k, g)] for k in range(chunks)]) if chunks else np.zeros(0, np.int64)
        read = sorted_unique(read)
        read = read[member_of[read] != g]
        for k in range(chunks):
            ids = read[chunk_of[read] == k]
            out.later[(k, g)] = _by_owner(np.setdiff1d(ids, out.peer[(k, g)]), member_of)
    return out


def _exchange(wanted: list[np.ndarray], g: int, member_of: np.ndarray, position) -> HaloPlan:
    """Member g's side of a group exchange where member p receives `wanted[p]` (by owner, then id): g sends
    each peer its rows among them (at `position(ids)` in its rows), and receives its own `wanted[g]`."""
    send, recv = [], []
    for p in range(len(wanted)):
        if p == g:
            send.append(torch.zeros(0, dtype=torch.int64))
            recv.append(0)
            continue
        theirs = wanted[p][member_of[wanted[p]] == g]  # by id: the order p receives them in from g
        send.append(torch.as_tensor(position(theirs), dtype=torch.int64))
        recv.append(int(np.count_nonzero(member_of[wanted[g]] == p)))
    return HaloPlan(tuple(send), tuple(recv))


def member_structures(graph: Graph, view: str, parts: np.ndarray, chunks: int, groups: int) -> \
        list[MemberStructures]:
    """Every member's chunk structures over `view` (the send side of a group exchange needs the peers')."""
    parts = np.asarray(parts, dtype=np.int64)
    n = graph.num_nodes
    lists = _lists(graph, view, parts, chunks, groups)
    member_of = parts % groups
    dst = graph.edges(view)[1]
    own = {(k, g): np.nonzero(parts == k * groups + g)[0] for k in range(chunks) for g in range(groups)}
    result = []
    for g in range(groups):
        structures = []
        for k in range(chunks):
            mine, peer, hist = own[(k, g)], lists.peer[(k, g)], lists.hist[(k, g)]
            col = np.full(n, -1, dtype=np.int64)
            col[mine] = np.arange(len(mine))
            ext = np.concatenate([peer, hist]).astype(np.int64)
            col[ext] = len(mine) + np.arange(len(ext))
            e = lists.edges[(k, g)]
            view_k = _chunk_view(graph, view, e, col[lists.sources[(k, g)]], np.searchsorted(mine, dst[e]),
                                 len(mine), len(mine) + len(ext))
            chunk = ChunkStructure(view_k, torch.as_tensor(ext), len(peer), None)
            if groups > 1:
                def position(ids, mine=mine):
                    return np.searchsorted(mine, ids)
                chunk.halo = _exchange([lists.peer[(k, p)] for p in range(groups)], g, member_of, position)
                chunk.later = _exchange([lists.later[(k, p)] for p in range(groups)], g, member_of, position)
                chunk.later_ids = torch.as_tensor(lists.later[(k, g)])
            structures.append(chunk)
        refresh, refresh_ids = None, torch.zeros(0, dtype=torch.int64)
        if groups > 1:
            rows, _ = member_rows(parts, chunks, groups, g)
            pos = np.full(n, -1, dtype=np.int64)
            pos[rows] = np.arange(len(rows))
            needs = [_refresh_ids(lists, chunks, p, member_of) for p in range(groups)]
            refresh, refresh_ids = _exchange(needs, g, member_of, lambda ids: pos[ids]), torch.as_tensor(needs[g])
        result.append(MemberStructures(structures, refresh, refresh_ids))
    return result


def _refresh_ids(lists: _Lists, chunks: int, member: int, member_of: np.ndarray) -> np.ndarray:
    """The peer-owned rows among all of `member`'s ext rows, by (owner, id)."""
    ext = [np.concatenate([lists.peer[(k, member)], lists.hist[(k, member)]]) for k in range(chunks)]
    ids = sorted_unique(np.concatenate(ext)) if ext else np.zeros(0, np.int64)
    return _by_owner(ids[member_of[ids] != member], member_of)


@dataclass(frozen=True)
class GroupRows:
    """Rows one member moves per history layer and epoch ([G] arrays, member g at g); a layer's bytes are
    these rows times the value's width.

    received, sent: the chunks' peer rows (with their gradients back when the value has one);
    later_received, later_sent: the rows a passing chunk hands to the peers' histories (forward only);
    refresh: the peer rows fetched before the layer in a full pass; history: the rows read from the history.
    """

    received: np.ndarray
    sent: np.ndarray
    later_received: np.ndarray
    later_sent: np.ndarray
    refresh: np.ndarray
    history: np.ndarray


def group_rows(graph: Graph, view: str, parts: np.ndarray, chunks: int, groups: int) -> GroupRows:
    """What each member of a group moves and reads over `view` (see GroupRows).

    Counted off the distinct (destination part, source) pairs of the edges, one sort of the edges in all (the
    planner prices a pipeline per group size): member g of chunk k receives the sources in chunk k another
    member owns (its peer rows) and reads the sources outside chunk k from the history; of the rows it reads
    from the history in any chunk, those a peer owns and it does not receive in that chunk are handed to it
    (later); its refresh fetches every peer-owned row among them all. The same rows as the lists
    `member_structures` builds (`_lists`), by chunk and member."""
    parts = np.asarray(parts, dtype=np.int64)
    n = graph.num_nodes
    src, dst = graph.edges(view)
    src = np.asarray(src, dtype=np.int64)
    chunk_of, member_of = parts // groups, parts % groups
    pair = sorted_unique(parts[np.asarray(dst, dtype=np.int64)] * n + src)  # (destination part, source), once
    part, s = pair // n, pair % n
    k, g = part // groups, part % groups
    peer = (chunk_of[s] == k) & (member_of[s] != g)
    hist = chunk_of[s] != k

    def per_member(members: np.ndarray) -> np.ndarray:
        return np.bincount(members, minlength=groups).astype(np.int64)

    # a history row read by member g in any chunk, owned by a peer: handed to g where g does not receive it
    read = sorted_unique(g[hist] * n + s[hist])
    read_g, read_s = read // n, read % n
    read_g, read_s = read_g[member_of[read_s] != read_g], read_s[member_of[read_s] != read_g]
    handed = (chunk_of[read_s] * groups + read_g) * n + read_s  # as pairs: in the chunk of the row
    later = ~np.isin(handed, pair[peer], assume_unique=True)
    refresh = np.zeros(groups, dtype=np.int64)
    if groups > 1:  # every peer-owned row among the member's peer and history rows
        ext = sorted_unique(g[peer | hist] * n + s[peer | hist])
        ext_g, ext_s = ext // n, ext % n
        refresh = per_member(ext_g[member_of[ext_s] != ext_g])
    return GroupRows(received=per_member(g[peer]), sent=per_member(member_of[s[peer]]),
                     later_received=per_member(read_g[later]), later_sent=per_member(member_of[read_s[later]]),
                     refresh=refresh, history=per_member(g[hist]))
