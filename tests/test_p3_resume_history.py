"""A resumed run reads back the history its checkpoint holds, flags included (`evaluated`, which --eval-every
writes into every epoch's record): resuming failed on every run once records held it, push-pull's too."""
from __future__ import annotations

from pathlib import Path

import pytest

from gnnc.runtime.checkpoint import CheckpointError, _check_extra


def test_a_history_record_may_hold_flags(tmp_path: Path) -> None:
    rec = {"epoch": 0, "loss": 1.9, "time_s": 0.1, "bytes_sent": 10, "val_acc": 0.3, "evaluated": False}
    _check_extra({"history": [rec]}, 0, tmp_path / "rank-0.ckpt")
    for bad in ({**rec, "loss": True}, {**rec, "note": "text"}):  # a required field stays a number
        with pytest.raises(CheckpointError, match="history record 0"):
            _check_extra({"history": [bad]}, 0, tmp_path / "rank-0.ckpt")
