"""gnnc.graph: graphs in memory (`storage`), the files and generators they come from (`loaders`,
`generators`, `planetoid`) and the datasets shipped with gnnc.

Below the passes and the runtime, which both read graphs: it imports only
the IR's names (`gnnc.ir`) and gnnc's errors.
"""
from gnnc.graph.storage import (CSR, Graph, GraphView, index_dtype, input_density, row_blocks,  # noqa: F401
                                sorted_unique, sparse_if_sparse)
