"""`gnnc run --save-model M`, `gnnc predict M` (issue 41, item 2).

A GraphSAGE trained on one generated graph predicts on another of the same feature width, and its predictions
are `gnnc.to_torch`'s module's on the same inputs; on the graph it was trained on they are the run's logits.
The file is data (torch.load with weights_only=True), and a graph of another width, weights of another model
or a file that is not a saved model are exit 2 naming what differs.
"""
from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

import gnnc
from gnnc.cli import main
from gnnc.errors import GnncError
from gnnc.saved_model import FORMAT, load_saved

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TRAIN = "sbm:n=400,features=16,classes=4,seed=1"
OTHER = "sbm:n=300,features=16,classes=4,seed=2"  # another graph, the same feature width


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, Path]:
    """(the saved model, the run's logits) of a GraphSAGE trained on TRAIN by the command line."""
    d = tmp_path_factory.mktemp("saved")
    rc = main(["run", str(EXAMPLES / "sage.gnn"), "--graph", TRAIN, "--epochs", "5", "--save-model", str(d / "sage.m"),
               "--dump-logits", str(d / "logits.pt")])
    assert rc == 0
    return d / "sage.m", d / "logits.pt"


def predict(model: Path, graph: str, out: Path, *extra: str) -> np.ndarray:
    assert main(["predict", str(model), "--graph", graph, "-o", str(out), *extra]) == 0
    return np.load(out)


def test_graphsage_predicts_on_another_graph_as_to_torch_does(saved, tmp_path: Path) -> None:
    model, _ = saved
    got = predict(model, OTHER, tmp_path / "other.npy")
    other = gnnc.load_graph(OTHER)
    assert got.shape == (other.num_nodes, 4)
    module = gnnc.to_torch(gnnc.load_model(EXAMPLES / "sage.gnn", features=16, classes=4), model).eval()
    ei = torch.stack([torch.as_tensor(other.src), torch.as_tensor(other.dst)]).to(torch.int64)
    with torch.no_grad():
        np.testing.assert_allclose(got, module(other.x, ei).numpy(), rtol=0, atol=1e-6)


def test_on_its_own_graph_it_gives_the_runs_logits(saved, tmp_path: Path) -> None:
    model, logits = saved
    np.testing.assert_allclose(predict(model, TRAIN, tmp_path / "own.npy"), torch.load(logits).numpy(), rtol=0,
                               atol=1e-6)


def test_a_layers_output(saved, tmp_path: Path) -> None:
    """--output names a layer (its output: the embeddings) or a vertex value; the last layer's output is the logits."""
    model, _ = saved
    embeddings = predict(model, OTHER, tmp_path / "l0.npy", "--output", "l0")
    assert embeddings.shape == (300, 16)
    np.testing.assert_allclose(predict(model, OTHER, tmp_path / "l1.npy", "--output", "l1"),
                               predict(model, OTHER, tmp_path / "logits.npy"), rtol=0, atol=1e-6)


def test_the_file_is_data_with_the_models_source_ir_and_schema(saved) -> None:
    model, _ = saved
    payload = torch.load(model, weights_only=True)
    assert payload["format"] == FORMAT
    assert payload["model"]["source"] == (EXAMPLES / "sage.gnn").read_text()
    assert payload["schema"] == {"graph": TRAIN, "features": 16, "classes": 4, "edge_data": {}}
    assert str(load_saved(model).program) == payload["ir"]
    assert sorted(payload["weights"]) == ["l0.linear0.bias", "l0.linear0.weight", "l0.linear1.weight",
                                          "l1.linear0.bias", "l1.linear0.weight", "l1.linear1.weight"]


class Payload:
    def __reduce__(self):
        return (print, ("ran",))


@pytest.mark.parametrize("argv, message", [
    (["--graph", "planetoid:cora"], "the model expects 16 input features but graph 'cora' has 1433"),
    (["--graph", OTHER, "--output", "l7"], "model GraphSAGE has no layer or vertex value of that name (its layers: "
                                          "d0, l0, d1, l1;"),
])
def test_another_width_or_an_unknown_output_is_exit_2(saved, argv: list[str], message: str, tmp_path: Path,
                                                     capsys) -> None:
    assert main(["predict", str(saved[0]), *argv, "-o", str(tmp_path / "x.npy")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.npy").exists()


def test_what_is_not_a_saved_model_is_exit_2(tmp_path: Path, capsys) -> None:
    code = tmp_path / "code.m"
    code.write_bytes(pickle.dumps(Payload()))
    buf = io.BytesIO()
    torch.save({"weights": {}}, buf)
    other = tmp_path / "other.m"
    other.write_bytes(buf.getvalue())
    for path, message in [(tmp_path / "none.m", "none.m: no such file"), (code, "code.m: not a gnnc saved model"),
                          (other, f"other.m: not a gnnc saved model (no '{FORMAT}' format field")]:
        assert main(["predict", str(path), "--graph", OTHER, "-o", str(tmp_path / "x.npy")]) == 2
        captured = capsys.readouterr()
        assert message in captured.err and "ran" not in captured.out


def test_weights_of_another_width_are_refused(saved) -> None:
    wide = gnnc.load_model(EXAMPLES / "sage.gnn", features=16, classes=4, hidden=32)
    with pytest.raises(GnncError, match=r"weight l0\.linear0\.weight has shape \[16, 16\] but the model's is "
                                        r"\[16, 32\]"):
        gnnc.to_torch(wide, saved[0])


def test_an_unwritable_save_model_is_refused_before_training(tmp_path: Path, capsys) -> None:
    assert main(["run", str(EXAMPLES / "sage.gnn"), "--graph", TRAIN, "--epochs", "1",
                 "--save-model", str(tmp_path / "missing" / "m")]) == 2
    assert "--save-model" in capsys.readouterr().err
