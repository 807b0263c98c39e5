"""The cost model: the time, bytes and memory of every strategy, as named sympy formulas.

Why this package exists: the planner chooses a strategy per segment of
layers by comparing predictions, and `--explain` must be able to say *why*:
print the formula behind a number and the point (a bandwidth, a hidden size)
where the choice would flip. So every cost is a sympy expression over named
symbols (`symbols`), built from compute terms (`compute`) and alpha-beta
collectives (`collectives`) by a function registered against its strategy's
descriptor (`registry`; one module per family: `neutronstar`, `p3`, `mggcn`,
`local`, `gnnpipe`, and `sampled` for sampled minibatches), plus the layout changes between segments (`layouts`); evaluated on
numpy arrays (`evaluation`), solved for crossovers (`crossovers`), drawn as
the predicted epoch (`schedule`) and fitted to this machine (`fit`); a
compile's inputs to them (`inputs`) and the tables a planner prices with them
(`priced`) are defined here too. The cost model reads the analyses below it
(gnnc.passes.analysis, gnnc.passes.partition), never a planner or a pass
(tests/test_layering.py). A whole
run's peak memory per process (`memory`) adds parameters, optimizer state,
the graph and the process to the same per-layer formula; `gnnc run` checks it
against the memory available before it allocates.

Rules every formula follows: compute is op-aware; compute and communication
that overlap take the max, not the sum; communication is alpha-beta.
Import what you use from its module (`from gnnc.passes.cost.neutronstar
import depcomm`); importing the package registers every built-in formula.
"""
from gnnc.passes.cost import gnnpipe, local, mggcn, neutronstar, p3, sampled  # noqa: F401  (they register)
