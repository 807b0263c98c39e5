"""gnnc.ir: the IR (`core`), its one text form (`text`), its ops (`ops`), the verifier (`verify`), dim
helpers (`dims`) and the reader of dim and number expressions (`expr`: text to sympy without evaluating it).

The bottom layer of gnnc with the graph (`gnnc.graph`) and the plan
(`gnnc.plan`): it imports nothing of the front end, the passes or the runtime.
"""
from gnnc.ir.core import (DOMAINS, LAYER_KINDS, PRIMITIVES, VIEWS, Eqn, Layer, Param, Program, Type, Value,  # noqa: F401
                          all_values, attrs_of, dim, fmt_dim)
from gnnc.ir.verify import VerifyError, verify  # noqa: F401  (after the core: verify runs the ops' type rules)
