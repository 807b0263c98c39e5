"""The block cache (gnnc.runtime.block_cache): torch's large CPU blocks are reused, values are what torch
computes, the memory held stays within a quarter above the largest live set, and without a compiler
torch's allocator stays."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from gnnc.runtime import block_cache
from gnnc.runtime.kernels import native

needs_cache = pytest.mark.skipif(not block_cache.install(), reason="block cache unavailable")

MiB = 1 << 20


@needs_cache
def test_a_freed_large_block_is_handed_to_the_next_request_of_its_size() -> None:
    block_cache.empty()
    a = torch.empty(3 * MiB // 4, dtype=torch.float32)  # 3 MiB
    where = a.data_ptr()
    del a
    before = block_cache.stats()
    b = torch.empty(3 * MiB // 4 - 100, dtype=torch.float32)  # a little smaller: the same block
    after = block_cache.stats()
    assert b.data_ptr() == where
    assert after.hits == before.hits + 1 and after.misses == before.misses
    small = torch.empty(1000)  # under 1 MiB: torch's own allocator, not counted
    assert block_cache.stats().hits == after.hits and block_cache.stats().misses == after.misses
    del b, small


@needs_cache
@pytest.mark.parametrize("nbytes", [1000, 3 * MiB])
def test_raw_allocate_and_raw_deallocate_go_through_the_allocator_that_made_the_block(nbytes: int) -> None:
    """What oneDNN's and torch's scratch buffers do: raw_deallocate calls the allocator's raw deleter, for a
    block of any size (a small one is torch's allocator's own: given back there, not taken as a kept one)."""
    lib = block_cache._State.lib
    before = block_cache.stats()
    for _ in range(3):
        assert lib.gnnc_block_cache_raw_round_trip(nbytes) == 0
    after = block_cache.stats()
    assert after.live == before.live
    assert after.cached - before.cached in ((0,) if nbytes < block_cache.MIN_BYTES else (0, nbytes))


def _in_a_fresh_process(code: str) -> None:
    """Run `code` (after the cache's install) in a new interpreter: what these tests count (blocks live, kept,
    reused) assumes no other tensor of the process holds a block, which the suite's earlier tests cannot promise
    (after an in-process training run, a 2 MiB block stayed live in the suite's process)."""
    prelude = "import torch\nfrom gnnc.runtime import block_cache\nassert block_cache.install()\nMiB = 1 << 20\n"
    r = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


@needs_cache
def test_a_block_much_larger_than_the_request_is_not_used() -> None:
    _in_a_fresh_process("""
block_cache.empty()
a = torch.empty(4 * MiB // 4)
where = a.data_ptr()
del a
b = torch.empty(2 * MiB // 4)  # half the kept block's size: a new one
assert b.data_ptr() != where
""")


@needs_cache
def test_values_through_the_cache_match_float64() -> None:
    """Reused blocks hold old bytes; every op that reads its output's memory must still compute the same."""
    g = torch.Generator().manual_seed(7)
    for _ in range(3):  # the second and third rounds run on kept blocks
        x = torch.randn(700, 600, generator=g, dtype=torch.float64)
        w = torch.randn(600, 500, generator=g, dtype=torch.float64)
        ref = (x @ w).relu().sum(0)
        got = (x.float() @ w.float()).relu().sum(0)
        zeros = torch.zeros(600, 600)
        assert torch.equal(zeros, torch.zeros_like(zeros)) and float(zeros.abs().sum()) == 0.0
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-3)


@needs_cache
def test_the_memory_held_stays_within_a_quarter_above_the_largest_live_set() -> None:
    _in_a_fresh_process("""
block_cache.empty()
g = torch.Generator().manual_seed(0)
high = 0
for _ in range(200):  # sizes that keep changing: kept blocks must give way
    sizes = (torch.randint(1, 12, (3,), generator=g) * MiB).tolist()
    live = [torch.empty(s // 4) for s in sizes]
    s = block_cache.stats()
    high = max(high, s.live)
    assert s.live + s.cached <= s.high * 5 // 4 + 4096
    del live
s = block_cache.stats()
assert s.live == 0 and s.high >= high and s.cached <= s.high * 5 // 4, s
block_cache.empty()
s = block_cache.stats()
assert s.cached == 0 and s.high == s.live, s
""")


@needs_cache
def test_what_is_kept_beyond_the_largest_live_set_stays_within_max_slack_bytes() -> None:
    """A live set whose quarter is above MAX_SLACK_BYTES (1.5 GiB of blocks: address space only, never written),
    freed, then asked for again in sizes none of its blocks fits: the cache keeps at most MAX_SLACK_BYTES beyond
    the largest live set (a quarter alone kept 384 MiB here; at ogbn-products' size 1.9 GiB, issue 35)."""
    _in_a_fresh_process("""
block_cache.empty()
first = [torch.empty(128 * MiB // 4) for _ in range(12)]
del first
second = []
for _ in range(15):  # 100 MiB: a kept 128 MiB block wastes more than an eighth, so every request misses
    second.append(torch.empty(100 * MiB // 4))
    s = block_cache.stats()
    assert s.live + s.cached <= s.high + block_cache.MAX_SLACK_BYTES, (s, block_cache.MAX_SLACK_BYTES)
assert s.high == 12 * 128 * MiB and s.cached > 0, s  # a bound, not an empty cache
""")


def test_without_a_cxx_compiler_torch_keeps_its_allocator(tmp_path) -> None:
    """In a fresh process: no compiler on PATH, install() says no and why, and torch computes as before."""
    code = ("import torch; from gnnc.runtime import block_cache as b; from gnnc.runtime.kernels import native; "
            "native.find_compiler = lambda recipe=None: None; ok = b.install(); x = torch.ones(1 << 20); "
            "print(ok, b.stats(), float(x.sum()), b.status())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split()[:3] == ["False", "None", "1048576.0"]
    assert "no C++ compiler" in out.stdout


def test_a_failing_build_leaves_torchs_allocator(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    if native.find_compiler(block_cache.recipe()) is None:
        pytest.skip("no C++ compiler")
    bad = tmp_path / "broken.cpp"
    bad.write_text("this is not C++\n")
    recipe = block_cache.recipe()
    broken = native.Recipe(recipe.name, (bad,), recipe.compilers, recipe.flags, recipe.flag_sets, recipe.libraries)
    path, why = native.build(native.find_compiler(recipe), tmp_path, broken)
    assert path is None and "error" in why
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".so"]  # nothing half-built is left


@pytest.mark.parametrize("switch", [native.ENV_SWITCH, block_cache.ENV_SWITCH])
def test_turned_off_with_the_compiled_kernels_or_alone(switch: str) -> None:
    code = "from gnnc.runtime import block_cache as b; print(b.install(), b.status())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, switch: "0"})
    assert out.stdout.startswith(f"False torch's allocator (turned off by {switch}=0)")
