"""gnnc: a compiler from GNN programs (.gnn) to distributed execution plans.

The Python API mirrors the command line:

    import gnnc
    model = gnnc.load_model("examples/gcn.gnn", hidden=32)
    graph = gnnc.load_graph("planetoid:cora")
    plan = gnnc.compile(model, graph)
    result = gnnc.run(plan, graph, epochs=200)
"""
from gnnc.api import Model, Plan, compile, load_graph, load_model, load_model_source, partition, run  # noqa: F401
from gnnc.elaborate import elaborate  # noqa: F401
from gnnc.errors import GnncError  # noqa: F401
from gnnc.pass_manager import register_pass  # noqa: F401
from gnnc.ir_text import parse_ir  # noqa: F401
from gnnc.passes.cost.registry import register_cost  # noqa: F401
