"""One result type from the rank to the caller, and one parse of the IR per rank.

Rank 0 used to return its summary as a dict, which the API turned into a RunResult and the CLI back into a dict
(adding fields on the way); and a rank parsed the plan's IR text twice (once to ask whether it is a pipeline,
once to build its worker).
"""
from __future__ import annotations

import dataclasses
import io

import pytest
import torch

from conftest import EXAMPLES
import gnnc
from gnnc.runtime import distributed
from gnnc.runtime.distributed import DistJob
from gnnc.runtime.launch import _read_result, check_plain
from gnnc.runtime.train import SUMMARY_FIELDS, RunResult, TrainConfig



def test_a_rank_hands_back_a_run_result_as_data(tmp_path) -> None:
    result = RunResult(0.5, 0.25, 0.5, 1.0, 0.01, torch.arange(6.0).reshape(3, 2), [{"epoch": 0.0, "loss": 1.0}],
                       graph="cora", world_size=2, strategies=["depcomm"])
    check_plain(result)  # what the worker checks before it writes
    buf = io.BytesIO()
    torch.save(result, buf)
    (tmp_path / "result-0.pt").write_bytes(buf.getvalue())
    back = _read_result(tmp_path, 0)
    assert type(back) is RunResult and back.to_json() == result.to_json()
    assert torch.equal(back.logits, result.logits) and back.history == result.history
    assert set(result.to_json()) == set(SUMMARY_FIELDS)


def test_only_the_run_result_class_is_read_back(tmp_path) -> None:
    @dataclasses.dataclass
    class Other:
        x: int = 1

    with pytest.raises(TypeError, match="a worker's result holds"):
        check_plain(Other())
    with pytest.raises(TypeError, match=r"the result\.history\[0\]\['a'\]"):
        check_plain(RunResult(0, 0, 0, 0, 0, None, [{"a": object()}]))


def test_a_job_parses_its_ir_once(monkeypatch) -> None:
    calls = []
    real = distributed.parse_ir

    def counting(text, *args):
        calls.append(text)
        return real(text, *args)

    monkeypatch.setattr(distributed, "parse_ir", counting)
    job = DistJob(str(gnnc.load_model(EXAMPLES / "gcn.gnn").program(None)), "/nonexistent", TrainConfig())
    assert job.program is job.program and len(calls) == 1
