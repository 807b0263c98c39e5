"""Tests of the user-written strip-sync pass, with gnnc.testing."""
from __future__ import annotations

from pathlib import Path

import pytest

import strip_sync  # noqa: F401  (registers the pass)
from gnnc.testing import FileCheckError, assert_rewrite_exact, filecheck, run_pass

GCN = Path(__file__).resolve().parent.parent / "gcn.gnn"


def test_sync_is_removed() -> None:
    out = run_pass("lower,strip-sync", GCN)
    filecheck(out, """
        CHECK: layer l0 graph GCNConv
        CHECK: spmm[reduce=sum]
        CHECK-NOT: sync[
        CHECK: %l0.h:vertex:f32[hidden] = bias(%l0.a, %l0.bias0.bias)
    """)


def test_outputs_and_gradients_unchanged() -> None:
    assert_rewrite_exact("strip-sync", GCN)


def test_failing_expectation_names_the_line() -> None:
    out = run_pass("lower,strip-sync", GCN)
    with pytest.raises(FileCheckError, match="check line 3: CHECK: sync"):
        filecheck(out, "CHECK: layer l0\nCHECK: spmm\nCHECK: sync[reduce=sum]\n")
