"""Issue 40, the command line and graph inputs: bad input is a message naming what is wrong and exit 2.

Numbers no run can use (`inf`, `1e400`, integers past int64, `abc` for a count) used to surface deep in
a run as a traceback; output paths into a missing directory failed only after training; `gnnc run PLAN`
dropped the sampling and schedule flags a plan fixes; graph files with a sparse or bf16 `x`, a zip-bomb
array or negative edge weights ended in a traceback, an allocation or a NaN loss; a .gnn file nested too
deeply was reported at 1:1. Everything runs in-process on a 6-vertex graph and starts no worker.
"""
from __future__ import annotations

import io
import tracemalloc
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import EXAMPLES
from gnnc import cli
from gnnc.errors import GraphInputError
from gnnc.graph import loaders
from gnnc.host import AvailableMemory

GCN = str(EXAMPLES / "gcn.gnn")


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch) -> None:
    """Graph-cache entries go to this test's directory, not the repository's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def refused(capsys, *argv: str) -> str:
    """stderr of a command that must end with exit 2 and no traceback."""
    try:
        code = cli.main(list(argv))
    except SystemExit as stop:  # argparse's own refusal of a flag's value
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err, err
    return err


# --- numbers on the command line -----------------------------------------------------------------

RUN = ("run", GCN, "--graph", "planetoid:cora")
COMPILE = ("compile", GCN, "--graph", "planetoid:cora")
PARTITION = ("partition", "--graph", "planetoid:cora", "--parts", "2", "--method", "hash", "-o", "/nonexistent")


@pytest.mark.parametrize("argv, flag, says", [
    ((*RUN, "--timeout", "inf"), "--timeout", "finite"),
    ((*RUN, "--timeout", "nan"), "--timeout", "finite"),
    ((*RUN, "--timeout", "1e9"), "--timeout", "at most"),
    ((*RUN, "--memory-cap", "1e400"), "--memory-cap", "number of bytes"),
    ((*RUN, "--memory-cap", "2000000T"), "--memory-cap", "2^60"),
    ((*RUN, "--seed", "1e23"), "--seed", "whole number"),
    ((*RUN, "--seed", "100000000000000000000000"), "--seed", "at most 9223372036854775807"),
    ((*RUN, "--seed", "-1"), "--seed", "at least 0"),
    ((*RUN, "--epochs", "100000000000000000000000"), "--epochs", "at most"),
    ((*RUN, "--epochs", "2.5"), "--epochs", "whole number"),
    ((*RUN, "--lr", "1e400"), "--lr", "finite"),
    ((*RUN, "--weight-decay=-inf"), "--weight-decay", "finite"),
    ((*RUN, "--checkpoint-every", "0"), "--checkpoint-every", "at least 1"),
    ((*RUN, "--fanout", "2,2", "--batch-size", "1e3"), "--batch-size", "whole number"),
    ((*RUN, "--pipeline-groups", "-3"), "--pipeline-groups", "at least 0"),
    ((*COMPILE, "--workers", "abc"), "--workers", "whole number"),
    ((*COMPILE, "--workers", "1e3"), "--workers", "whole number"),
    ((*COMPILE, "--memory-cap", "inf"), "--memory-cap", "number of bytes"),
    (("probe", "--threads", "0"), "--threads", "at least 1"),
    (("probe", "--threads", str(2**40)), "--threads", "at most 4096"),  # torch: "Overflow when unpacking long"
    (("probe", "--network", "--timeout", "inf"), "--timeout", "finite"),
    ((*PARTITION, "--seed", "100000000000000000000000"), "--seed", "at most"),
    ((*PARTITION, "--layers", "100000000000000000000000"), "--layers", "at most 100"),
])
def test_a_numeric_flag_no_run_can_use_is_refused_naming_the_flag(capsys, argv, flag, says) -> None:
    err = refused(capsys, *argv)
    assert f"argument {flag}: " in err and says in err, err


def test_every_numeric_flag_is_parsed_by_a_validating_type() -> None:
    """Python's int and float take inf, nan and unbounded integers: no flag may use them bare."""
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if a.choices and "run" in a.choices)
    bare = [f"{name} {'/'.join(a.option_strings)}" for name, sub in subparsers.choices.items()
            for a in sub._actions if a.type in (int, float)]
    # a count with its own check naming the flag, at least 1 and at most the cluster's or the graph's size
    assert sorted(bare) == ["partition --parts", "run --nproc"]


def test_set_refuses_a_number_that_is_not_finite(capsys) -> None:
    assert "--set hidden=1e400: expected a finite number" in refused(capsys, "check", GCN, "--set", "hidden=1e400")
    assert "--set hidden=nan: expected a finite number" in refused(capsys, "check", GCN, "--set", "hidden=nan")


def test_flags_in_range_still_parse() -> None:
    args = cli.build_parser().parse_args([*RUN, "--timeout", "0.5", "--memory-cap", "1.5G", "--seed",
                                          "9223372036854775807", "--lr", "0", "--pipeline-groups", "0"])
    assert (args.timeout, args.memory_cap, args.seed, args.lr) == (0.5, 3 << 29, (1 << 63) - 1, 0.0)
    assert cli.build_parser().parse_args([*COMPILE, "--workers", "auto"]).workers == "auto"
    assert cli.build_parser().parse_args([*COMPILE, "--workers", "4"]).workers == 4


# --- output paths, checked before any work -------------------------------------------------------

def six(tmp_path: Path, name: str = "six.npz", **fields) -> str:
    """A 6-vertex graph file: a ring plus two chords, 3 features, 2 classes, `fields` added or replaced."""
    arrays = {"edge_index": np.array([[0, 1, 2, 3, 4, 5, 1, 2], [1, 2, 3, 4, 5, 0, 0, 1]]),
              "x": np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32),
              "y": np.array([0, 1, 0, 1, 0, 1])}
    arrays.update(fields)
    np.savez(tmp_path / name, **arrays)
    return str(tmp_path / name)


@pytest.mark.parametrize("flag", ["--dump-logits", "--metrics"])
def test_an_output_file_in_a_missing_directory_is_refused_before_training(tmp_path, capsys, flag) -> None:
    missing = tmp_path / "no" / "such"
    err = refused(capsys, "run", GCN, "--graph", six(tmp_path), "--epochs", "1", flag, str(missing / "out"))
    assert f"{flag} {missing / 'out'}: directory {missing} does not exist" in err, err
    assert not (tmp_path / "no").exists()  # --metrics made the tree
    assert "test acc" not in capsys.readouterr().out


def test_an_output_file_that_is_a_directory_is_refused(tmp_path, capsys) -> None:
    err = refused(capsys, "run", GCN, "--graph", six(tmp_path), "--epochs", "1", "--dump-logits", str(tmp_path))
    assert "is a directory" in err


# --- gnnc run PLAN: the flags a plan fixes --------------------------------------------------------

@pytest.mark.parametrize("flags, says", [
    (("--fanout", "3,3"), "--fanout 3,3: the plan was compiled for fan-outs 2,2"),
    (("--batch-size", "4"), "--batch-size 4: the plan was compiled for batches of 2 seeds"),
    (("--schedule", "2f2b"), "--schedule 2f2b: the plan was compiled for the sequential schedule"),
    (("--pipeline-groups", "2"), "--pipeline-groups 2: the plan was compiled with no pipeline"),
])
def test_run_plan_refuses_a_sampling_or_schedule_flag_that_contradicts_it(tmp_path, capsys, flags, says) -> None:
    plan = tmp_path / "plan"
    assert cli.main(["compile", str(EXAMPLES / "sage.gnn"), "--graph", six(tmp_path), "--fanout", "2,2",
                     "--batch-size", "2", "-o", str(plan)]) == 0
    capsys.readouterr()
    err = refused(capsys, "run", str(plan), "--epochs", "1", *flags)
    assert says in err and "recompile" in err, err
    assert cli.main(["run", str(plan), "--epochs", "1", "--fanout", "2,2", "--batch-size", "2"]) == 0  # agrees


# --- graph files: sparse and bf16 tensors, zip bombs, negative edge weights ------------------------

def six_pt(tmp_path: Path, **fields) -> str:
    arrays = {"edge_index": torch.tensor([[0, 1, 2, 3, 4, 5, 1, 2], [1, 2, 3, 4, 5, 0, 0, 1]]),
              "x": torch.randn(6, 3, generator=torch.Generator().manual_seed(0)), "y": torch.tensor([0, 1] * 3)}
    arrays.update(fields)
    torch.save(arrays, tmp_path / "six.pt")
    return str(tmp_path / "six.pt")


@pytest.mark.parametrize("convert", [lambda x: x.to_sparse(), lambda x: x.to_sparse_csr(), lambda x: x.bfloat16()],
                         ids=["sparse-coo", "sparse-csr", "bf16"])
def test_a_pt_graph_with_sparse_or_bf16_x_loads_as_dense_float32(tmp_path, convert) -> None:
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(1)).bfloat16().float()  # exact in bf16
    graph = loaders.load_graph(six_pt(tmp_path, x=convert(x)), use_cache=False)
    assert graph.x.dtype == torch.float32 and torch.equal(graph.x, x)


def test_a_sparse_x_whose_indices_pass_its_shape_is_refused_naming_x(tmp_path, capsys) -> None:
    forged = torch.sparse_coo_tensor(torch.tensor([[100000], [0]]), torch.tensor([1.0]), (6, 3),
                                     check_invariants=False)  # torch.load does not check: to_dense wrote past x
    err = refused(capsys, "check", GCN, "--graph", six_pt(tmp_path, x=forged))
    assert "six.pt: x: a sparse tensor whose indices do not fit its shape [6, 3]" in err, err


def test_a_sparse_x_too_large_to_make_dense_is_refused_naming_x(tmp_path, capsys) -> None:
    huge = torch.sparse_coo_tensor(torch.tensor([[0], [0]]), torch.tensor([1.0]), (6, 10**13), check_invariants=True)
    err = refused(capsys, "check", GCN, "--graph", six_pt(tmp_path, x=huge))
    assert "six.pt: x: a sparse torch.float32 tensor of shape [6, 10000000000000], made dense," in err, err


def forged_npy(shape: tuple[int, ...]) -> bytes:
    """A .npy member whose header declares `shape` (float32) but holds 16 bytes of data."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return out.getvalue() + bytes(16)


def test_an_npz_array_declaring_a_huge_shape_is_refused_before_allocating(tmp_path, capsys) -> None:
    path = Path(six(tmp_path))
    with zipfile.ZipFile(path, "a") as archive:  # the later x.npy is the one np.load reads
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Duplicate name"
            archive.writestr("x.npy", forged_npy((10**6, 10**6)), compress_type=zipfile.ZIP_DEFLATED)
    err = refused(capsys, "check", GCN, "--graph", str(path))
    assert "x: declares shape [1000000, 1000000] of float32 (3.6 TiB) but holds 16 B" in err, err


def test_npz_arrays_beyond_the_memory_available_are_refused_naming_the_largest(tmp_path, capsys,
                                                                               monkeypatch) -> None:
    monkeypatch.setattr(loaders, "available_memory", lambda: AvailableMemory(100, "test"))
    err = refused(capsys, "check", GCN, "--graph", six(tmp_path, x=np.zeros((6, 30), dtype=np.float32)))
    assert "six.npz: its arrays (the largest x, 720 B) would need" in err and "100 B available (test)" in err, err


def test_a_negative_edge_weight_is_refused_at_load_naming_edge_weight(tmp_path, capsys) -> None:
    weights = np.ones(8, dtype=np.float32)
    weights[5] = -3.0  # vertex 0's in-edges 5 and 6 sum to -2: gcn_norm's deg^-1/2 was NaN, "loss is nan"
    err = refused(capsys, "run", GCN, "--graph", six(tmp_path, edge_weight=weights), "--epochs", "1")
    assert "six.npz: edge_weight: negative weight -3 at edge 5 (1 negative); edge weights must be >= 0" in err, err


def test_a_signed_edge_field_other_than_the_weight_is_kept(tmp_path) -> None:
    sign = np.array([1, -1, 1, -1, 1, -1, 1, -1], dtype=np.float32)
    graph = loaders.load_graph(six(tmp_path, edge_sign=sign), use_cache=False)
    assert graph.edge_data["sign"].tolist() == sign.tolist()


def test_the_edge_list_memory_check_budgets_what_a_load_allocates(tmp_path, monkeypatch) -> None:
    n = 1_000_000
    path = tmp_path / "edges.txt"
    path.write_text(f"0 1\n{n - 1} 0\n")  # two edges, a million vertices: the per-vertex arrays dominate
    tracemalloc.start()
    try:
        loaders.load_edge_list(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    monkeypatch.setattr(loaders, "available_memory", lambda: AvailableMemory(int(0.9 * peak), "test"))
    with pytest.raises(GraphInputError, match=f"makes N = {n} vertices"):  # the 15 B budgeted let it through
        loaders.load_edge_list(path)
    monkeypatch.setattr(loaders, "available_memory", lambda: AvailableMemory(peak, "test"))
    assert loaders.load_edge_list(path).num_nodes == n  # and no more than it needs is asked


# --- a .gnn file nested too deeply ---------------------------------------------------------------

def nested(tmp_path: Path, expr: str) -> str:
    path = tmp_path / "deep.gnn"
    path.write_text(f"model M(features, classes) {{\n  h = x\n  h = {expr}\n"
                    f"  loss = cross_entropy(h, y, mask = train)\n}}\n")
    return str(path)


@pytest.mark.parametrize("depth", [400, 10_000])  # 400: elaboration's RecursionError; 10000: reported at 1:1
def test_nesting_too_deep_is_reported_where_the_limit_is_exceeded(tmp_path, capsys, depth) -> None:
    err = refused(capsys, "check", nested(tmp_path, "relu(" * depth + "x" + ")" * depth))
    # the 127th relu( (column 7 + 5 * 126) is where the syntax tree passes 256 levels: the model and the
    # assignment take the first ones, each call two (call, args)
    assert f"deep.gnn:3:{7 + 5 * 126}: expression is nested too deeply" in err, err


def test_nesting_within_the_limit_elaborates(tmp_path, capsys) -> None:
    assert cli.main(["check", nested(tmp_path, "relu(" * 120 + "x" + ")" * 120)]) == 0
