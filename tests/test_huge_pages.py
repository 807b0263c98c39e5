"""gnnc.host.use_huge_pages: the allocator setting every process gnnc starts runs with."""
from __future__ import annotations

import os

import pytest

from gnnc import cli
from gnnc.host import HUGE_PAGES, use_huge_pages


def test_huge_pages_are_turned_on_unless_the_user_chose() -> None:
    env: dict[str, str] = {}
    assert use_huge_pages(env) is True and env == {HUGE_PAGES: "1"}
    off = {HUGE_PAGES: "0"}
    assert use_huge_pages(off) is False and off == {HUGE_PAGES: "0"}


def test_the_command_line_sets_them_before_any_command(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.delenv(HUGE_PAGES, raising=False)
    assert cli.main(["passes"]) == 0
    assert os.environ[HUGE_PAGES] == "1"  # what torch reads at its first allocation, and workers inherit
