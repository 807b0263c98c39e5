"""Exchanges as descriptors (gnnc.plan.comm_ops) with their runtime implementations registered by decorator.

The toy exchange `halo_halves` below is defined in this file alone: its
descriptor (`define_comm_op`: a halo's byte rule, no split) and its
implementation (`@implements_exchange`: the halo's rows sent as two column
halves, two messages per peer). Nothing else in gnnc names it, yet a plan
holding it predicts its bytes, and two gloo ranks run it with the measured
bytes equal to the prediction and the single-process logits and gradients.
"""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from _rank_pool import pooled_launch
from conftest import EXAMPLES, SCHEDULES, random_graph
from gnnc import api
from gnnc.errors import GnncError
from gnnc.ir import Eqn
from gnnc.ir.ops import define_op, op_def
from gnnc.ir.text import parse_ir
from gnnc.passes.manager import DEFAULT_PIPELINE, DISTRIBUTED_PIPELINE
from gnnc.passes.predict_bytes import predict
from gnnc.plan.comm_ops import (COMM_OP_DEFS, PIECES, CommOpDef, byte_kinds, comm_op, define_comm_op, draw_order,
                                exchange_of, halo_rows, schedule_options)
from gnnc.plan.schedule_attrs import exchange_schedule
from gnnc.runtime import comm
from gnnc.runtime.distributed import DistJob, Exchange, one_step
from gnnc.runtime.implementations import EXCHANGES, exchange_implementation, implements_exchange
from gnnc.runtime.launch import DistConfig
from gnnc.runtime.train import TrainConfig
from test_distributed_exact import SEED, reference, rel

TOY = "halo_halves"

# The toy's definition: a halo's rows (its byte rule), delivered whole, in a halo's message order.
define_comm_op(CommOpDef(TOY, "a halo whose rows travel as two column halves", halo_rows, ordered=True))


# The toy's implementation: the held rows, then the halo's remote rows, each half of the columns a message of its own.
@implements_exchange(TOY)
def _halo_halves(ex: Exchange, x: torch.Tensor, e: Eqn) -> torch.Tensor:
    layer = ex.layer
    assert layer is not None and layer.halo is not None
    held = x[: layer.n_in]
    cut = held.shape[1] // 2
    label = e.outs[0].name.split(".")[0]
    halves = [comm.halo_exchange(held[:, a:b], layer.halo, ex.stats, label=label, method=exchange_schedule(e).method)
              for a, b in ((0, cut), (cut, held.shape[1]))]
    return torch.cat([held, torch.cat(halves, dim=1)], dim=0)


def _one_step(cfg: DistConfig, job: DistJob):
    """A rank's step, from this module: each spawned rank imports it, and so registers the toy exchange."""
    return one_step(cfg, job)


def _with_toy(program_text: str) -> str:
    """The plan's IR with every halo made the toy (its `overlap` flag dropped: the toy has no split)."""
    def swap(m: re.Match) -> str:
        attrs = ", ".join(a for a in m.group(1).split(", ") if not a.startswith("overlap="))
        return f"= {TOY}[{attrs}]("
    return re.sub(r"= halo\[([^\]]*)\]\(", swap, program_text)


def test_a_toy_exchange_defined_here_runs_on_two_ranks_with_its_predicted_bytes(tmp_path) -> None:
    graph = random_graph(n=40, e=160, f=6, c=3, seed=2)
    model = api.load_model(EXAMPLES / "gcn.gnn")
    passes = DEFAULT_PIPELINE + DISTRIBUTED_PIPELINE[:-1] + [SCHEDULES["none"]]
    plan = api.compile(model, graph, workers=2, strategy="depcomm", partition="metis", passes=passes)
    program = parse_ir(_with_toy(str(plan.program)))
    assert sum(e.op == TOY for layer in program.layers for e in layer.eqns) == 2
    assert not any(e.op == "halo" for layer in program.layers for e in layer.eqns)
    _, halo_totals = predict(plan.program, graph, plan.parts, 2)
    program, predicted = predict(program, graph, plan.parts, 2)
    # its byte rule is a halo's: the same bytes, counted under its own name
    assert predicted[TOY] == halo_totals["halo"] > 0 and predicted["halo"] == 0
    assert predicted["allreduce"] == halo_totals["allreduce"]
    shards = plan.write_shards(tmp_path / "toy")
    job = DistJob(str(program), str(shards), TrainConfig(seed=SEED, progress=False, use_kernels=False))
    got = pooled_launch(_one_step, 2, job)[0]
    print(f"{TOY}: predicted {predicted[TOY]} bytes, measured {got['bytes_by_op']}")
    assert got["bytes_by_op"] == {"halo": predicted[TOY], "allreduce": predicted["allreduce"]}
    logits, loss, grads = reference(api.compile(model, graph).program, graph)
    print(f"{TOY}: logits differ from one process by {rel(got['logits'], logits):.1e}")
    assert rel(got["logits"], logits) <= 1e-5 and abs(got["loss"] - loss) <= 1e-5 * abs(loss)
    assert all(rel(got["grads"][k], g) <= 1e-5 for k, g in grads.items())


def test_the_descriptors_hold_what_the_name_switches_held() -> None:
    # the byte totals every plan lists: the kinds of the exchanges a strategy inserts (a fetch is a halo)
    assert byte_kinds() == ("halo", "bcast_rows", "reduce_scatter")
    assert comm_op("fetch").counted_as == "halo" and comm_op("history").rows is None
    # the schedule options of each strategy's formula: its exchanges' split flags, their chunk flags, then G3's bins
    assert {s: schedule_options(s) for s in ("depcomm", "hybrid", "depcache", "bcast1d", "pushpull")} == {
        "depcomm": ("overlap", "chunked", "bins"), "hybrid": ("overlap", "chunked", "bins"), "depcache": ("bins",),
        "bcast1d": ("staged",), "pushpull": ()}
    assert draw_order("depcomm") == PIECES and draw_order("bcast1d")[:2] == ("dense", "communication")
    assert comm_op("reduce_scatter").output_rows == "owned" and comm_op("bcast_rows").parts_read_once
    assert TOY in COMM_OP_DEFS and exchange_implementation(TOY) is _halo_halves
    # every split exchange has its parts and their bounds registered
    for d in COMM_OP_DEFS.values():
        if d.split_flag is not None:
            assert {(d.name, "parts"), (d.name, "bounds")} <= set(EXCHANGES)


def test_a_malformed_or_missing_exchange_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="already defined"):
        define_comm_op(CommOpDef("halo", "again", halo_rows))
    with pytest.raises(ValueError, match="not a communication op"):
        define_comm_op(CommOpDef("relu", "", halo_rows))
    with pytest.raises(ValueError, match="without a split_flag"):
        CommOpDef("x", "", halo_rows, split_in_bins=True)
    with pytest.raises(KeyError, match="unknown exchange 'nope'"):
        implements_exchange("nope")(_halo_halves)
    with pytest.raises(GnncError, match="no parts implementation of exchange 'halo_halves'"):
        exchange_implementation(TOY, "parts")


def test_a_communication_op_without_a_descriptor_is_refused_not_priced_as_nothing() -> None:
    """An IR comm op defined without its CommOpDef: predict-bytes used to count it as 0 bytes (a static op list)."""
    define_op(dataclasses.replace(op_def("halo"), name="halo_undescribed"))
    with pytest.raises(KeyError, match="'halo_undescribed' has no CommOpDef"):
        exchange_of("halo_undescribed")
    assert exchange_of("relu") is None and exchange_of("halo") is comm_op("halo")
