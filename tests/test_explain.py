"""`gnnc compile --explain` (issue 21, item 12): names the cluster it priced on, keeps its columns for
deep models, and says why the chosen assignment won (and what the memory cap ruled out)."""
from __future__ import annotations

import dataclasses
import re

import pytest

import gnnc
from conftest import EXAMPLES, random_graph
from gnnc.passes.cost.memory import parameter_sizes
from gnnc.cluster import DEFAULT_CLUSTER, preset
from gnnc.inspect_plan import explain
from gnnc.plan.strategies import describe_assignment


@pytest.fixture(scope="module")
def graph():
    return random_graph(n=120, e=600, f=16, c=4)


def _table(text: str, header: str) -> list[str]:
    """The lines of the table that starts with `header` (up to the first line that is not indented as it)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith(header))
    rows = [lines[start]]
    for line in lines[start + 1:]:
        if not line.startswith("  ") or line.startswith("  ruled out") or not re.search(r"\d", line):
            break
        rows.append(line)
    return rows


def test_default_cluster_is_named_and_deep_models_keep_their_columns(graph) -> None:
    model = gnnc.load_model(EXAMPLES / "gcnii.gnn", layers=6)
    plan = gnnc.compile(model, graph, workers=4, explain=True)  # no --cluster: the default profile
    text = explain(plan)
    assert f"on cluster '{DEFAULT_CLUSTER}'" in text and "'None'" not in text
    rows = _table(text, "strategies")
    assert len(rows) > 3
    header = rows[0]
    for row in rows[1:]:
        ends = [m.end() for m in re.finditer(r"\d+\.\d+", row)]
        assert len(ends) == 3, row
        # every number ends where its column's heading ends, whatever the width of the strategy names
        assert ends == [header.index(h) + len(h) for h in ("time ms", "MB/epoch", "MiB/worker")], (row, header)
    chosen = plan.meta.planner.strategies
    assert f"  {describe_assignment(chosen)} " in text and "x6" in text  # six layers folded, not six names
    assert re.search(rf"^why {re.escape(describe_assignment(chosen))}: the fastest assignment that fits in memory, "
                     r"\d+\.\d\dx faster than the next, ", text, re.M), text
    assert re.search(r"^  chosen: .* = \d+\.\d{3} ms$", text, re.M) and re.search(r"^  next: ", text, re.M)


def test_explain_names_what_the_memory_cap_ruled_out(graph) -> None:
    model = gnnc.load_model(EXAMPLES / "gcn.gnn")
    roomy = preset(DEFAULT_CLUSTER)
    free = gnnc.compile(model, graph, workers=4, cluster=roomy).meta.planner
    fastest = min(free.alternatives, key=lambda a: a["time_s"])
    assert fastest["strategies"] == free.strategies
    others = [a["memory_bytes"] for a in free.alternatives if a["memory_bytes"] < fastest["memory_bytes"]]
    assert others, "this graph gives no assignment leaner than the fastest; pick another"
    # the assignments compete for a worker's memory less the weights, their gradients and Adam's moments
    weights = 4 * sum(s.bytes for s in parameter_sizes(gnnc.compile(model, graph).program))
    tight = dataclasses.replace(roomy, name="tight",
                                memory_per_worker=(max(others) + fastest["memory_bytes"]) / 2 + weights)
    plan = gnnc.compile(model, graph, workers=4, cluster=tight, explain=True)
    text = explain(plan)
    assert "on cluster 'tight'" in text
    assert plan.meta.planner.strategies != fastest["strategies"]
    assert f"  ruled out by the memory cap: {describe_assignment(fastest['strategies'])} would take" in text, text
