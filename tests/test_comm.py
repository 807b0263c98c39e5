"""Each communication op, run by 2 and 4 gloo processes, against the single-process computation.

Every rank builds the same global data from one seed, runs the distributed op
on its part, and compares the forward result and the gradient of a random
loss with what one process computes on the whole data (plain indexing and
torch.autograd). Bytes counted by CommStats are compared with a brute-force
count over the data. One launch per world size runs all checks (process start
costs seconds on this machine); each test then reads its op's report.
"""
from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from _rank_pool import pooled_launch
from gnnc.errors import PlanError
from gnnc.runtime import comm
from gnnc.plan.halo import HaloPlan
from gnnc.runtime.comm import CommStats
from gnnc.runtime.launch import DistConfig

SEED = 1234
TOL = 1e-6
F64 = torch.float64


def _err(got: torch.Tensor | None, want: torch.Tensor) -> float:
    """Largest absolute difference; infinite when shapes differ or the value is missing."""
    if got is None or tuple(got.shape) != tuple(want.shape):
        return math.inf
    return float((got.double() - want.double()).abs().max()) if want.numel() else 0.0


def _bytes(stats: CommStats, op: str, direction: str) -> int:
    return sum(c.bytes for (_, o, d), c in stats.counts.items() if o == op and d == direction)


def _split_sizes(total: int, parts: int) -> list[int]:
    """Near-equal sizes, the larger first (7 over 4 -> 2, 2, 2, 1)."""
    return [total // parts + (1 if k < total % parts else 0) for k in range(parts)]


def _offsets(sizes: list[int]) -> list[int]:
    out = [0]
    for s in sizes:
        out.append(out[-1] + s)
    return out


# --- the checks, run inside each worker --------------------------------------------------------


def _halo_setup(rank: int, world: int, gen: torch.Generator) -> dict[str, Any]:
    n, f = 23, 5
    owner = torch.randint(0, world, (n,), generator=gen)
    owner[:world] = torch.arange(world)  # every rank owns at least one vertex
    local_ids = [torch.nonzero(owner == r).flatten() for r in range(world)]
    # needs[p]: remote vertices rank p reads (one row per (vertex, remote rank) pair)
    needs = [torch.nonzero((torch.rand(n, generator=gen) < 0.45) & (owner != p)).flatten()
             for p in range(world)]
    x_full = torch.randn(n, f, generator=gen, dtype=F64)
    g = [torch.randn(len(needs[p]), f, generator=gen, dtype=F64) for p in range(world)]
    loc = [torch.randn(len(local_ids[r]), f, generator=gen, dtype=F64) for r in range(world)]
    # The plan: rank i sends to p the vertices p needs that i owns, in global id order.
    position = torch.empty(n, dtype=torch.int64)
    for r in range(world):
        position[local_ids[r]] = torch.arange(len(local_ids[r]))
    send_idx = tuple(position[needs[p][owner[needs[p]] == rank]] if p != rank
                     else torch.empty(0, dtype=torch.int64) for p in range(world))
    recv_counts = tuple(int((owner[needs[rank]] == i).sum()) if i != rank else 0 for i in range(world))
    # Received rows come by (peer, position): needs of this rank grouped by owner.
    halo_ids = torch.cat([needs[rank][owner[needs[rank]] == i] for i in range(world)])
    # Single process: the whole loss, its gradient, this rank's rows of it.
    x = x_full.clone().requires_grad_()
    total = sum((x[torch.cat([needs[p][owner[needs[p]] == i] for i in range(world)])] * g[p]).sum()
                for p in range(world))
    total = total + sum((x[local_ids[r]].sin() * loc[r]).sum() for r in range(world))
    total.backward()
    sent_pairs = sum(int(((owner[needs[p]] == rank)).sum()) for p in range(world) if p != rank)
    return {"plan": HaloPlan(send_idx, recv_counts), "x_local": x_full[local_ids[rank]],
            "want_out": x_full[halo_ids], "want_grad": x.grad[local_ids[rank]], "g": g[rank],
            "loc": loc[rank], "fwd_bytes": sent_pairs * f * 8, "bwd_bytes": len(halo_ids) * f * 8,
            "f": f, "sent_pairs": sent_pairs, "n_halo": len(halo_ids)}


def _check_halo(rank: int, world: int, method: str, overlap: bool) -> dict[str, Any]:
    s = _halo_setup(rank, world, torch.Generator().manual_seed(SEED))
    stats = CommStats()
    comm.check_halo_plan(s["plan"], len(s["x_local"]))
    x = s["x_local"].clone().requires_grad_()
    if overlap:
        handle = comm.start_halo_exchange(x, s["plan"], stats, label="layer0", method=method)
        local = (x.sin() * s["loc"]).sum()  # local work while the rows are in flight
        out = handle.wait()
    else:
        out = comm.halo_exchange(x, s["plan"], stats, label="layer0", method=method)
        local = (x.sin() * s["loc"]).sum()
    ((out * s["g"]).sum() + local).backward()
    return {"fwd": _err(out, s["want_out"]), "bwd": _err(x.grad, s["want_grad"]),
            "bytes": (_bytes(stats, "halo", "fwd"), _bytes(stats, "halo", "bwd")),
            "want_bytes": (s["fwd_bytes"], s["bwd_bytes"])}


def _check_halo_float32(rank: int, world: int) -> dict[str, Any]:
    """Pure data movement is exact in float32, and bytes follow the element size."""
    s = _halo_setup(rank, world, torch.Generator().manual_seed(SEED))
    stats = CommStats()
    out = comm.halo_exchange(s["x_local"].float(), s["plan"], stats)
    return {"fwd": _err(out, s["want_out"].float()) if out.dtype == torch.float32 else math.inf,
            "bytes": _bytes(stats, "halo", "fwd"), "want_bytes": s["sent_pairs"] * s["f"] * 4}


def _check_bad_plan(rank: int, world: int) -> str:
    """Rank 0 expects one row too many from rank 1: rank 0 must get a PlanError, the others none."""
    s = _halo_setup(rank, world, torch.Generator().manual_seed(SEED))
    plan = s["plan"]
    if rank == 0:
        counts = list(plan.recv_counts)
        counts[1] += 1
        plan = HaloPlan(plan.send_idx, tuple(counts))
    try:
        comm.check_halo_plan(plan, len(s["x_local"]))
    except PlanError as exc:
        return f"PlanError: {exc}"
    return "ok"


def _layout_setup(world: int, gen: torch.Generator) -> dict[str, Any]:
    rows = [(3 + 2 * k) % 5 for k in range(world)]  # uneven, one rank owns no row
    cols = _split_sizes(7, world)  # F = 7 does not divide by 2 or 4
    n, f = sum(rows), sum(cols)
    return {"rows": rows, "cols": cols, "n": n, "f": f,
            "x": torch.randn(n, f, generator=gen, dtype=F64),
            "g": [torch.randn(n, cols[k], generator=gen, dtype=F64) for k in range(world)],
            "h": [torch.randn(rows[k], f, generator=gen, dtype=F64) for k in range(world)]}


def _check_vertex_to_feature(rank: int, world: int) -> dict[str, Any]:
    s = _layout_setup(world, torch.Generator().manual_seed(SEED + 1))
    rows, cols, ro, co = s["rows"], s["cols"], _offsets(s["rows"]), _offsets(s["cols"])
    stats = CommStats()
    x = s["x"][ro[rank]:ro[rank + 1]].clone().requires_grad_()
    y = comm.vertex_to_feature(x, rows, cols, stats)
    (y * s["g"][rank]).sum().backward()
    ref = s["x"].clone().requires_grad_()
    sum((ref[:, co[k]:co[k + 1]] * s["g"][k]).sum() for k in range(world)).backward()
    # brute force: every element of my rows whose column another rank holds
    fwd = sum(rows[rank] for c in range(s["f"]) if not co[rank] <= c < co[rank + 1]) * 8
    bwd = sum(cols[rank] for i in range(s["n"]) if not ro[rank] <= i < ro[rank + 1]) * 8
    return {"fwd": _err(y, s["x"][:, co[rank]:co[rank + 1]]),
            "bwd": _err(x.grad, ref.grad[ro[rank]:ro[rank + 1]]),
            "bytes": (_bytes(stats, "vertex_to_feature", "fwd"), _bytes(stats, "vertex_to_feature", "bwd")),
            "want_bytes": (fwd, bwd)}


def _check_feature_to_vertex(rank: int, world: int) -> dict[str, Any]:
    s = _layout_setup(world, torch.Generator().manual_seed(SEED + 2))
    rows, cols, ro, co = s["rows"], s["cols"], _offsets(s["rows"]), _offsets(s["cols"])
    stats = CommStats()
    x = s["x"][:, co[rank]:co[rank + 1]].clone().requires_grad_()
    y = comm.feature_to_vertex(x, rows, cols, stats)
    (y.tanh() * s["h"][rank]).sum().backward()
    ref = s["x"].clone().requires_grad_()
    sum((ref[ro[k]:ro[k + 1]].tanh() * s["h"][k]).sum() for k in range(world)).backward()
    back = comm.vertex_to_feature(y.detach(), rows, cols, CommStats())  # round trip
    fwd = sum(cols[rank] for i in range(s["n"]) if not ro[rank] <= i < ro[rank + 1]) * 8
    bwd = sum(rows[rank] for c in range(s["f"]) if not co[rank] <= c < co[rank + 1]) * 8
    return {"fwd": max(_err(y, s["x"][ro[rank]:ro[rank + 1]]), _err(back, x.detach())),
            "bwd": _err(x.grad, ref.grad[:, co[rank]:co[rank + 1]]),
            "bytes": (_bytes(stats, "feature_to_vertex", "fwd"), _bytes(stats, "feature_to_vertex", "bwd")),
            "want_bytes": (fwd, bwd)}


def _check_all_gather(rank: int, world: int, dim: int) -> dict[str, Any]:
    s = _layout_setup(world, torch.Generator().manual_seed(SEED + 3 + dim))
    sizes = s["rows"] if dim == 0 else s["cols"]
    off = _offsets(sizes)
    block = s["x"].narrow(dim, off[rank], sizes[rank])
    g = [torch.randn(s["n"], s["f"], generator=torch.Generator().manual_seed(SEED + 10 + k), dtype=F64)
         for k in range(world)]
    stats = CommStats()
    x = block.clone().requires_grad_()
    y = comm.all_gather(x, sizes, stats, dim=dim)
    (y.sin() * g[rank]).sum().backward()
    ref = s["x"].clone().requires_grad_()
    sum((ref.sin() * g[k]).sum() for k in range(world)).backward()
    numel = block.numel()
    others = s["x"].numel() - numel
    return {"fwd": _err(y, s["x"]), "bwd": _err(x.grad, ref.grad.narrow(dim, off[rank], sizes[rank])),
            "bytes": (_bytes(stats, "all_gather", "fwd"), _bytes(stats, "all_gather", "bwd")),
            "want_bytes": (numel * (world - 1) * 8, others * 8)}


def _check_reduce_scatter(rank: int, world: int, dim: int) -> dict[str, Any]:
    s = _layout_setup(world, torch.Generator().manual_seed(SEED + 5 + dim))
    sizes = s["rows"] if dim == 0 else s["cols"]
    off = _offsets(sizes)
    partials = [torch.randn(s["n"], s["f"], generator=torch.Generator().manual_seed(SEED + 20 + k),
                            dtype=F64) for k in range(world)]
    g = [torch.randn(s["n"], s["f"], generator=torch.Generator().manual_seed(SEED + 30 + k), dtype=F64)
         for k in range(world)]
    stats = CommStats()
    x = partials[rank].clone().requires_grad_()
    y = comm.reduce_scatter(x, sizes, stats, dim=dim)
    (y.cos() * g[rank].narrow(dim, off[rank], sizes[rank])).sum().backward()
    refs = [p.clone().requires_grad_() for p in partials]
    total = sum(refs)
    sum((total.narrow(dim, off[k], sizes[k]).cos() * g[k].narrow(dim, off[k], sizes[k])).sum()
        for k in range(world)).backward()
    numel = s["x"].numel()
    mine = s["x"].narrow(dim, off[rank], sizes[rank]).numel()
    return {"fwd": _err(y, total.detach().narrow(dim, off[rank], sizes[rank])),
            "bwd": _err(x.grad, refs[rank].grad),
            "bytes": (_bytes(stats, "reduce_scatter", "fwd"), _bytes(stats, "reduce_scatter", "bwd")),
            "want_bytes": ((numel - mine) * 8, mine * (world - 1) * 8)}


def _check_staged_broadcast(rank: int, world: int) -> dict[str, Any]:
    """MG-GCN's SpMM: Y_r = sum_j A_rj H_j with H_j broadcast from rank j, stage by stage."""
    gen = torch.Generator().manual_seed(SEED + 7)
    rows = [(3 + 2 * k) % 5 for k in range(world)]
    n, f = sum(rows), 4
    off = _offsets(rows)
    a = torch.randn(n, n, generator=gen, dtype=F64) * (torch.rand(n, n, generator=gen) < 0.4)
    h = torch.randn(n, f, generator=gen, dtype=F64)
    g = torch.randn(n, f, generator=gen, dtype=F64)
    stats = CommStats()
    x = h[off[rank]:off[rank + 1]].clone().requires_grad_()
    y = torch.zeros(rows[rank], f, dtype=F64)
    for j, hj in comm.staged_broadcast(x, rows, stats):
        y = y + a[off[rank]:off[rank + 1], off[j]:off[j + 1]] @ hj
    (y * g[off[rank]:off[rank + 1]]).sum().backward()
    ref = h.clone().requires_grad_()
    ((a @ ref) * g).sum().backward()
    return {"fwd": _err(y, (a @ h)[off[rank]:off[rank + 1]]),
            "bwd": _err(x.grad, ref.grad[off[rank]:off[rank + 1]]),
            "bytes": (_bytes(stats, "broadcast", "fwd"), _bytes(stats, "broadcast", "bwd")),
            "want_bytes": (rows[rank] * f * (world - 1) * 8, (n - rows[rank]) * f * 8)}


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)).double()
    model.register_parameter("extra", torch.nn.Parameter(torch.randn(6, dtype=F64)))
    return model


def _replica_loss(model: torch.nn.Module, r: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(SEED + 100 + r)
    x = torch.randn(4 + r, 5, generator=gen, dtype=F64)
    loss = (model(x) ** 2).sum()
    if r == 0:  # only rank 0 uses `extra`: the others contribute zeros for it
        loss = loss + (model.extra ** 3).sum()
    return loss


def _check_grad_allreduce(rank: int, world: int, overlap: bool, given: bool = False) -> dict[str, Any]:
    model = _model(SEED)
    stats = CommStats()
    n = len(list(model.parameters()))
    # given: the schedule's buckets (indices into the parameters, the last ones first), posted during backward
    buckets = [list(range(n - 1, n // 2 - 1, -1)), list(range(n // 2 - 1, -1, -1))] if given else None
    reducer = comm.GradAllReduce(model.parameters(), stats, bucket_bytes=96, overlap=overlap, buckets=buckets)
    _replica_loss(model, rank).backward()
    reducer.finish()
    reducer.remove_hooks()
    ref = _model(SEED)
    sum(_replica_loss(ref, r) for r in range(world)).backward()
    err = max(_err(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters()))
    numel = sum(p.numel() for p in model.parameters())
    return {"bwd": err, "bytes": _bytes(stats, "allreduce", "bwd"), "numel": numel,
            "buckets": len(reducer.buckets)}


def _check_bad_buckets() -> str:
    """Buckets that miss a parameter are refused before anything is posted."""
    try:
        comm.GradAllReduce(_model(SEED).parameters(), CommStats(), buckets=[[0]])
    except PlanError as err:
        return str(err)
    return "accepted"


def _check_pipe(rank: int, world: int) -> dict[str, Any]:
    """A chain of stages, stage k on rank k: h_k = tanh(h_{k-1} W_k); the last one computes the loss."""
    gen = torch.Generator().manual_seed(SEED + 9)
    widths = [3 + k for k in range(world + 1)]
    x0 = torch.randn(6, widths[0], generator=gen, dtype=F64)
    ws = [torch.randn(widths[k], widths[k + 1], generator=gen, dtype=F64) for k in range(world)]
    g = torch.randn(6, widths[-1], generator=gen, dtype=F64)
    stats = CommStats()
    w = ws[rank].clone().requires_grad_()
    h_in = x0 if rank == 0 else comm.pipe_recv((6, widths[rank]), F64, rank - 1, stats)
    h = torch.tanh(h_in @ w)
    if rank < world - 1:
        token = comm.pipe_send(h, rank + 1, stats)
        torch.autograd.backward([token], [torch.zeros(0, dtype=F64)])
        out = None
    else:
        (h * g).sum().backward()
        out = h.detach()
    refs = [t.clone().requires_grad_() for t in ws]
    hr = x0
    for k in range(world):
        hr = torch.tanh(hr @ refs[k])
    (hr * g).sum().backward()
    fwd = _err(out, hr.detach()) if rank == world - 1 else 0.0
    return {"fwd": fwd, "bwd": _err(w.grad, refs[rank].grad),
            "bytes": (_bytes(stats, "pipe", "fwd"), _bytes(stats, "pipe", "bwd")),
            "want_bytes": (6 * widths[rank + 1] * 8 if rank < world - 1 else 0,
                           6 * widths[rank] * 8 if rank > 0 else 0)}


def _run_checks(cfg: DistConfig) -> dict[str, Any]:
    r, m = cfg.rank, cfg.world_size
    return {
        "halo_ring": _check_halo(r, m, "ring", overlap=False),
        "halo_ring_paced": _check_halo(r, m, "ring_paced", overlap=False),
        "halo_all_to_all": _check_halo(r, m, "all_to_all", overlap=False),
        "halo_ring_overlap": _check_halo(r, m, "ring", overlap=True),
        "halo_a2a_overlap": _check_halo(r, m, "all_to_all", overlap=True),
        "halo_float32": _check_halo_float32(r, m),
        "bad_plan": _check_bad_plan(r, m),
        "vertex_to_feature": _check_vertex_to_feature(r, m),
        "feature_to_vertex": _check_feature_to_vertex(r, m),
        "all_gather_rows": _check_all_gather(r, m, 0),
        "all_gather_features": _check_all_gather(r, m, 1),
        "reduce_scatter_rows": _check_reduce_scatter(r, m, 0),
        "reduce_scatter_features": _check_reduce_scatter(r, m, 1),
        "staged_broadcast": _check_staged_broadcast(r, m),
        "grads_sync": _check_grad_allreduce(r, m, overlap=False),
        "grads_overlap": _check_grad_allreduce(r, m, overlap=True),
        "grads_given": _check_grad_allreduce(r, m, overlap=True, given=True),
        "grads_bad_buckets": _check_bad_buckets(),
        "pipe": _check_pipe(r, m),
    }


# --- the tests ---------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[2, 4], ids=["world2", "world4"])
def reports(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    """Every rank's reports, from one launch of `request.param` gloo processes."""
    return pooled_launch(_run_checks, request.param, timeout_s=60)


def _assert_exact(reports: list[dict[str, Any]], name: str) -> None:
    for rank, rep in enumerate(reports):
        r = rep[name]
        assert r["fwd"] <= TOL, f"rank {rank}: forward differs by {r['fwd']}"
        assert r["bwd"] <= TOL, f"rank {rank}: gradient differs by {r['bwd']}"
        assert r["bytes"] == r["want_bytes"], f"rank {rank}: counted {r['bytes']}, brute force {r['want_bytes']}"


@pytest.mark.parametrize("name", ["halo_ring", "halo_ring_paced", "halo_all_to_all", "halo_ring_overlap",
                                  "halo_a2a_overlap"])
def test_halo_exchange_matches_one_process(reports: list[dict[str, Any]], name: str) -> None:
    # Rows fetched equal the rows of the full matrix; mirror gradients are summed at the owner.
    _assert_exact(reports, name)
    assert sum(rep[name]["bytes"][0] for rep in reports) > 0  # the data really crossed ranks


def test_halo_exchange_counts_bytes_by_element_size(reports: list[dict[str, Any]]) -> None:
    for rank, rep in enumerate(reports):
        r = rep["halo_float32"]
        assert r["fwd"] == 0.0, f"rank {rank}: float32 rows differ"
        assert r["bytes"] == r["want_bytes"]


def test_check_halo_plan_names_the_mismatch(reports: list[dict[str, Any]]) -> None:
    assert reports[0]["bad_plan"].startswith("PlanError: rank 0: halo plan expects")
    assert "ranks [1]" in reports[0]["bad_plan"]
    assert all(rep["bad_plan"] == "ok" for rep in reports[1:])


@pytest.mark.parametrize("name", ["vertex_to_feature", "feature_to_vertex"])
def test_layout_transitions_match_one_process(reports: list[dict[str, Any]], name: str) -> None:
    # P3's vertex-partitioned <-> feature-partitioned layouts, F = 7 over 2 or 4 ranks.
    _assert_exact(reports, name)


@pytest.mark.parametrize("name", ["all_gather_rows", "all_gather_features",
                                  "reduce_scatter_rows", "reduce_scatter_features"])
def test_gather_and_scatter_match_one_process(reports: list[dict[str, Any]], name: str) -> None:
    _assert_exact(reports, name)


def test_staged_broadcast_matches_one_process(reports: list[dict[str, Any]]) -> None:
    _assert_exact(reports, "staged_broadcast")


def test_given_buckets_must_hold_every_parameter_once(reports: list[dict[str, Any]]) -> None:
    assert all("do not hold each of the" in rep["grads_bad_buckets"] for rep in reports)


@pytest.mark.parametrize("name", ["grads_sync", "grads_overlap", "grads_given"])
def test_bucketed_grad_allreduce_sums_replica_gradients(reports: list[dict[str, Any]], name: str) -> None:
    world = len(reports)
    for rank, rep in enumerate(reports):
        assert rep[name]["bwd"] <= TOL, f"rank {rank}: gradient differs by {rep[name]['bwd']}"
        assert rep[name]["buckets"] > 1  # the small bucket size really split the gradients
    # Over all ranks an all-reduce of B elements carries 2 (world - 1) B elements.
    numel = reports[0][name]["numel"]
    assert sum(rep[name]["bytes"] for rep in reports) == 2 * (world - 1) * numel * 8


def test_pipeline_send_recv_matches_one_process(reports: list[dict[str, Any]]) -> None:
    _assert_exact(reports, "pipe")


# --- single-process properties -----------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_ring_schedule_pairs_every_send_with_a_receive(world: int) -> None:
    schedules = [comm.ring_schedule(r, world) for r in range(world)]
    for j in range(world - 1):
        sends = {r: schedules[r][j][0] for r in range(world)}
        recvs = {r: schedules[r][j][1] for r in range(world)}
        assert sorted(sends.values()) == list(range(world))  # each step is a permutation
        for r, dst in sends.items():
            assert dst != r and recvs[dst] == r
    for r in range(world):  # over all steps, every peer exactly once
        assert sorted(d for d, _ in schedules[r]) == [p for p in range(world) if p != r]


@pytest.mark.parametrize("numel,world", [(10, 4), (3, 4), (0, 2), (17, 3)])
def test_allreduce_payload_sums_to_twice_world_minus_one(numel: int, world: int) -> None:
    total = sum(comm.allreduce_payload_bytes(numel, 4, r, world) for r in range(world))
    assert total == 2 * (world - 1) * numel * 4


def test_comm_stats_aggregates_by_label_and_op() -> None:
    stats = CommStats()
    stats.add_bytes("layer0", "halo", "fwd", 10)
    stats.add_bytes("layer0", "halo", "bwd", 7)
    stats.add_bytes("layer1", "halo", "fwd", 5)
    stats.add_bytes("grads", "allreduce", "bwd", 100)
    assert stats.total_bytes() == 122
    assert stats.bytes_by("label") == {"layer0": 17, "layer1": 5, "grads": 100}
    assert stats.bytes_by("op") == {"halo": 22, "allreduce": 100}
    assert list(stats.as_dict()) == ["grads/allreduce/bwd", "layer0/halo/bwd", "layer0/halo/fwd",
                                     "layer1/halo/fwd"]


def rank_1_of_4_posting_by(monkeypatch, post: Any) -> None:
    """A halo exchange of rank 1 of 4 with no process group, its point-to-point operations handed to `post`."""

    class P2POp:  # torch's checks its process group, which these tests have none of
        def __init__(self, op, tensor, peer, group=None):
            self.op, self.tensor, self.peer = op, tensor, peer

    monkeypatch.setattr(comm, "_rank_world", lambda group: (1, 4))
    monkeypatch.setattr(comm.dist, "P2POp", P2POp)
    monkeypatch.setattr(comm._HaloExchange, "_post_p2p", post)


@pytest.mark.parametrize("method", ["ring", "ring_paced"])
def test_a_ring_posts_each_receive_before_its_send(monkeypatch, method: str) -> None:
    """Rank 1 of 4 posts its receives first (every step's, or each step's before its send when paced):
    a send posted first kept the peer's rows waiting over gloo (gnnc.runtime.comm's _exchange)."""
    posted: list[tuple[str, int]] = []

    def post(self, ops: list[Any]) -> list[Any]:
        posted.extend(("recv" if op.op is comm.dist.irecv else "send", op.peer) for op in ops)
        return []

    rank_1_of_4_posting_by(monkeypatch, post)
    plan = HaloPlan(send_idx=(torch.tensor([0]), torch.tensor([], dtype=torch.long), torch.tensor([1]),
                              torch.tensor([0, 1])), recv_counts=(2, 0, 1, 1))
    op = comm._HaloExchange(plan, CommStats(), "layer0", None, method)
    op.forward_start(torch.arange(6.0).view(2, 3))
    ring = comm.ring_schedule(1, 4)  # (to, from) per step: (2, 0), (3, 3), (0, 2)
    sends = [("send", dst) for dst, _ in ring]
    recvs = [("recv", src) for _, src in ring]
    if method == "ring":
        assert posted == recvs + sends
    else:
        assert posted == [op for pair in zip(recvs, sends) for op in pair]


def test_an_epoch_record_keeps_the_seconds_each_op_blocked() -> None:
    from gnnc.runtime.metrics import EpochRecord

    stats = CommStats()
    stats.add_bytes("layer0", "halo", "fwd", 10)
    stats.add_time("layer0", "halo", "fwd", 0.25)
    stats.add_time("grads", "allreduce", "bwd", 0.5)
    rec = EpochRecord.from_stats(0, 0, 2, stats, epoch_s=1.0)
    assert rec.seconds_by_op == {"grads/allreduce/bwd": 0.5, "layer0/halo/fwd": 0.25}
    assert (rec.comm_s, rec.allreduce_s, rec.compute_s) == (0.25, 0.5, 0.25)
