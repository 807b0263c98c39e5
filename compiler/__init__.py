"""gnnc: a compiler from GNN programs (.gnn) to distributed execution plans."""
