"""gnnc.frontend: `.gnn` text to IR: the parser's syntax tree (`syntax`) and elaboration (`elaborate`)."""
