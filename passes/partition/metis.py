"""METIS k-way partitioning, through pymetis's bundled METIS.

Two uses: the classic edge-cut partition (`objective='cut'`, one balance
constraint on the vertex count: fewest edges between parts), and G3's
variant (G3 Eq. 1-3): minimise the communication volume (`objective='vol'`:
the number of (vertex, other part) pairs a vertex must be sent to, which is
sum_i |B_i| on a symmetric graph) under two balance constraints at once,
vertex count and degree (`constraints='vertices+degree'`, vertex weights
(1, in-degree)), k-way rather than recursive bisection.

pymetis's `part_graph` always passes one constraint (ncon = 1) to METIS, so
the multi-constraint call goes to the same bundled METIS library through
ctypes (`METIS_PartGraphKway` with ncon = 2); single-constraint calls use
pymetis's own API. Both run on the symmetric simple graph (METIS needs one).
The stats report the balance reached on each constraint, the edge cut and
the volume.
"""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from gnnc.errors import GnncError
from gnnc.graph.store import release_pages
from gnnc.graph import row_blocks, sorted_unique
from gnnc.passes.partition.core import EDGE_BLOCK, PartitionInput

OBJECTIVES = ("cut", "vol")
CONSTRAINTS = ("vertices", "vertices+degree")
MATCHINGS = {"rm": 0, "shem": 1}  # METIS_CTYPE_RM, METIS_CTYPE_SHEM (metis.h)
METIS_OK = 1
METIS_NOPTIONS = 40  # size of METIS 5's options array (METIS_NOPTIONS in metis.h)


def run(inp: PartitionInput, parts: int, seed: int, objective: str = "cut", constraints: str = "vertices",
        ufactor: int = 30, recursive: bool = False, matching: str = "shem") -> tuple[np.ndarray, dict[str, Any]]:
    """METIS on the symmetrised graph. ufactor: allowed imbalance in 1/1000 (30 = 3%, METIS's default).

    matching: METIS's coarsening (METIS_OPTION_CTYPE): "shem", heavy-edge matching, METIS's default, or "rm",
    random matching, both METIS's own. Measured on the products-like R-MAT (benchmarks/RESULTS-scale.md, session
    24): into 8 parts "rm" held less of METIS's memory (81 against 99 bytes per adjacency entry at 10M entries,
    89 against 111 at 21M) and cut fewer edges; into 2 it held more (106 against 97 at 21M). Not the default:
    every split made so far is heavy-edge matching's.
    """
    if objective not in OBJECTIVES:
        raise GnncError(f"metis: objective must be one of {', '.join(OBJECTIVES)}, got '{objective}'")
    if constraints not in CONSTRAINTS:
        raise GnncError(f"metis: constraints must be one of {', '.join(CONSTRAINTS)}, got '{constraints}'")
    if recursive and (objective != "cut" or constraints != "vertices"):
        raise GnncError("metis: recursive bisection only supports objective='cut' with constraints='vertices'")
    if matching not in MATCHINGS:
        raise GnncError(f"metis: matching must be one of {', '.join(MATCHINGS)}, got '{matching}'")
    indptr, indices = inp.undirected
    n = inp.num_nodes
    degree = inp.in_degree
    if parts == 1 or len(indices) == 0:
        # METIS needs edges to work on; without any, a balanced split of the ids is as good as any
        assignment = np.arange(n, dtype=np.int64) * parts // n
        objective_value = 0
    elif constraints == "vertices+degree":
        weights = np.stack([np.ones(n, dtype=np.int64), degree], axis=1)
        assignment, objective_value = metis_kway(indptr, indices, parts, weights, objective, seed, ufactor,
                                                 matching)
    else:
        import pymetis

        options = pymetis.Options(seed=seed, ufactor=ufactor,
                                  objtype=int(pymetis.ObjType.VOL if objective == "vol" else pymetis.ObjType.CUT))
        if matching != "shem":  # unset, METIS's default (SHEM): the options every earlier split ran with
            options.ctype = MATCHINGS[matching]
        idx = _idx_dtype()
        release_pages(inp.graph)  # a store's pages read so far: METIS's peak is the process's
        # np.asarray, not astype: the symmetric CSR is already METIS's idx_t (int64), and astype copied it
        result = pymetis.part_graph(parts, adjacency=pymetis.CSRAdjacency(np.asarray(indptr, dtype=idx),
                                                                          np.asarray(indices, dtype=idx)),
                                    recursive=recursive, options=options)
        assignment = np.asarray(result.vertex_part, dtype=np.int64)
        objective_value = int(result.edge_cuts)
    cut, volume = cut_and_volume(indptr, indices, assignment)
    sizes = np.bincount(assignment, minlength=parts)
    load = np.bincount(assignment, weights=degree, minlength=parts)
    return assignment, {
        "objective": objective,
        **({"matching": matching} if matching != "shem" else {}),
        "constraints": constraints,
        "objective_value": int(objective_value),
        "edge_cut": cut,
        "volume": volume,
        "vertex_balance": float(sizes.max() / sizes.mean()),
        "degree_balance": float(load.max() / load.mean()) if load.sum() else 1.0,
    }


def cut_and_volume(indptr: np.ndarray, indices: np.ndarray, assignment: np.ndarray) -> tuple[int, int]:
    """Undirected edges between parts, and sum over vertices of the other parts among their neighbours."""
    cut, remote = _cross(indptr, indices, assignment, int(assignment.max()) + 1)
    return cut, int(remote.sum())


def remote_sizes(indptr: np.ndarray, indices: np.ndarray, assignment: np.ndarray, parts: int) -> np.ndarray:
    """|B_i| per part over the symmetric graph: the distinct neighbours of part i's vertices outside i."""
    return _cross(indptr, indices, assignment, parts)[1]


def _cross(indptr: np.ndarray, indices: np.ndarray, assignment: np.ndarray, parts: int,
           block: int = EDGE_BLOCK) -> tuple[int, np.ndarray]:
    """(undirected edges between parts, |B_i| per part) in one pass over blocks of rows of the symmetric CSR.

    Row u (a neighbour of its entries' vertices) is remote to part i when one of its neighbours is in i and u
    is not: distinct (row, part) pairs, so a block of rows counts its own pairs and no pair spans two blocks.
    Each block's temporaries are about `block` entries: the whole pass held [entries]-long rows, masks and keys
    in int64, more than METIS's input, after METIS.
    """
    cut = 0
    remote = np.zeros(parts, dtype=np.int64)
    for lo, hi in row_blocks(indptr, block):
        a, b = int(indptr[lo]), int(indptr[hi])
        rows = np.repeat(np.arange(hi - lo, dtype=np.int64), np.diff(indptr[lo:hi + 1]))
        other = assignment[indices[a:b]]
        cross = assignment[lo:hi][rows] != other
        cut += int(np.count_nonzero(cross))
        keys = sorted_unique(rows[cross] * parts + other[cross])
        remote += np.bincount(keys % parts, minlength=parts)
    return cut // 2, remote


def _idx_dtype() -> np.dtype:
    """METIS's idx_t as compiled into pymetis (64-bit in current wheels)."""
    from pymetis import _internal

    return np.dtype(np.int64) if _internal._idx_type_width() == 64 else np.dtype(np.int32)


def metis_kway(indptr: np.ndarray, indices: np.ndarray, parts: int, weights: np.ndarray, objective: str,
               seed: int, ufactor: int, matching: str = "shem") -> tuple[np.ndarray, int]:
    """METIS_PartGraphKway with ncon = weights.shape[1] constraints; (assignment, objective value).

    Called through ctypes on the METIS that pymetis bundles, because pymetis
    passes ncon = 1 whatever the weights' length.
    """
    from pymetis import _internal

    lib = ctypes.CDLL(_internal.__file__)  # the extension exports METIS's C API
    idx = _idx_dtype()
    c_idx = ctypes.c_int64 if idx == np.int64 else ctypes.c_int32
    ptr = np.ctypeslib.ndpointer(dtype=idx, flags="C_CONTIGUOUS")
    kway = lib.METIS_PartGraphKway
    kway.restype = ctypes.c_int
    kway.argtypes = [ctypes.POINTER(c_idx), ctypes.POINTER(c_idx), ptr, ptr, ptr, ctypes.c_void_p,
                     ctypes.c_void_p, ctypes.POINTER(c_idx), ctypes.c_void_p, ctypes.c_void_p, ptr,
                     ctypes.POINTER(c_idx), ptr]
    options = np.zeros(METIS_NOPTIONS, dtype=idx)
    lib.METIS_SetDefaultOptions(options.ctypes.data_as(ctypes.c_void_p))
    names = _internal.options_indices
    options[names.OBJTYPE] = 1 if objective == "vol" else 0  # METIS_OBJTYPE_VOL / _CUT
    options[names.SEED] = seed
    options[names.UFACTOR] = ufactor
    if matching != "shem":
        options[names.CTYPE] = MATCHINGS[matching]
    options[names.NUMBERING] = 0
    n = len(indptr) - 1
    xadj = np.ascontiguousarray(indptr, dtype=idx)
    adjncy = np.ascontiguousarray(indices, dtype=idx)
    vwgt = np.ascontiguousarray(weights, dtype=idx).reshape(-1)  # row-major: constraints of a vertex together
    part = np.zeros(n, dtype=idx)
    objval = c_idx(0)
    status = kway(ctypes.byref(c_idx(n)), ctypes.byref(c_idx(weights.shape[1])), xadj, adjncy, vwgt, None, None,
                  ctypes.byref(c_idx(parts)), None, None, options, ctypes.byref(objval), part)
    if status != METIS_OK:
        raise RuntimeError(f"METIS_PartGraphKway failed with status {status}")
    return part.astype(np.int64), int(objval.value)
