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
from gnnc.passes.partition.core import PartitionInput
from gnnc.graph import sorted_unique

OBJECTIVES = ("cut", "vol")
CONSTRAINTS = ("vertices", "vertices+degree")
METIS_OK = 1
METIS_NOPTIONS = 40  # size of METIS 5's options array (METIS_NOPTIONS in metis.h)


def run(inp: PartitionInput, parts: int, seed: int, objective: str = "cut", constraints: str = "vertices",
        ufactor: int = 30, recursive: bool = False) -> tuple[np.ndarray, dict[str, Any]]:
    """METIS on the symmetrised graph. ufactor: allowed imbalance in 1/1000 (30 = 3%, METIS's default)."""
    if objective not in OBJECTIVES:
        raise GnncError(f"metis: objective must be one of {', '.join(OBJECTIVES)}, got '{objective}'")
    if constraints not in CONSTRAINTS:
        raise GnncError(f"metis: constraints must be one of {', '.join(CONSTRAINTS)}, got '{constraints}'")
    if recursive and (objective != "cut" or constraints != "vertices"):
        raise GnncError("metis: recursive bisection only supports objective='cut' with constraints='vertices'")
    indptr, indices = inp.undirected
    n = inp.num_nodes
    degree = inp.in_degree
    if parts == 1 or len(indices) == 0:
        # METIS needs edges to work on; without any, a balanced split of the ids is as good as any
        assignment = np.arange(n, dtype=np.int64) * parts // n
        objective_value = 0
    elif constraints == "vertices+degree":
        weights = np.stack([np.ones(n, dtype=np.int64), degree], axis=1)
        assignment, objective_value = metis_kway(indptr, indices, parts, weights, objective, seed, ufactor)
    else:
        import pymetis

        options = pymetis.Options(seed=seed, ufactor=ufactor,
                                  objtype=int(pymetis.ObjType.VOL if objective == "vol" else pymetis.ObjType.CUT))
        idx = _idx_dtype()
        result = pymetis.part_graph(parts, adjacency=pymetis.CSRAdjacency(indptr.astype(idx), indices.astype(idx)),
                                    recursive=recursive, options=options)
        assignment = np.asarray(result.vertex_part, dtype=np.int64)
        objective_value = int(result.edge_cuts)
    cut, volume = cut_and_volume(indptr, indices, assignment)
    sizes = np.bincount(assignment, minlength=parts)
    load = np.bincount(assignment, weights=degree, minlength=parts)
    return assignment, {
        "objective": objective,
        "constraints": constraints,
        "objective_value": int(objective_value),
        "edge_cut": cut,
        "volume": volume,
        "vertex_balance": float(sizes.max() / sizes.mean()),
        "degree_balance": float(load.max() / load.mean()) if load.sum() else 1.0,
    }


def cut_and_volume(indptr: np.ndarray, indices: np.ndarray, assignment: np.ndarray) -> tuple[int, int]:
    """Undirected edges between parts, and sum over vertices of the other parts among their neighbours."""
    rows = np.repeat(np.arange(len(indptr) - 1, dtype=np.int64), np.diff(indptr))
    cut = int(np.count_nonzero(assignment[rows] != assignment[indices])) // 2
    return cut, int(remote_sizes(indptr, indices, assignment, int(assignment.max()) + 1).sum())


def remote_sizes(indptr: np.ndarray, indices: np.ndarray, assignment: np.ndarray, parts: int) -> np.ndarray:
    """|B_i| per part over the symmetric graph: the distinct neighbours of part i's vertices outside i."""
    n = len(indptr) - 1
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    cross = assignment[rows] != assignment[indices]
    # row u (a neighbour of indices' vertex v) is remote to v's part: distinct (part, u) pairs
    keys = sorted_unique(assignment[indices[cross]] * n + rows[cross])
    return np.bincount(keys // n, minlength=parts).astype(np.int64)


def _idx_dtype() -> np.dtype:
    """METIS's idx_t as compiled into pymetis (64-bit in current wheels)."""
    from pymetis import _internal

    return np.dtype(np.int64) if _internal._idx_type_width() == 64 else np.dtype(np.int32)


def metis_kway(indptr: np.ndarray, indices: np.ndarray, parts: int, weights: np.ndarray, objective: str,
               seed: int, ufactor: int) -> tuple[np.ndarray, int]:
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
