"""The counter-based RNG: masks depend only on global ids, slices agree, statistics hold."""
from __future__ import annotations

import torch

from gnnc.runtime import rng


def test_rows_and_column_slices_agree() -> None:
    key = rng.stream_key(3, 7, 11)
    full = rng.draws16(key, torch.arange(50), 37)
    assert torch.equal(rng.draws16(key, torch.tensor([9, 3, 41]), 37), full[[9, 3, 41]])
    for start, stop in [(0, 10), (5, 20), (1, 2), (36, 37), (13, 37)]:
        assert torch.equal(rng.draws16(key, torch.arange(50), stop - start, start), full[:, start:stop])


def test_int32_hash_equals_the_int64_reference() -> None:
    x = torch.randint(0, 2**32, (1000,), dtype=torch.int64)
    assert torch.equal(rng._mix32(rng._as_int32(x)).to(torch.int64) & 0xFFFFFFFF, rng._mix64(x))


def test_draws_are_uniform_and_streams_differ() -> None:
    u = rng.uniform(rng.stream_key(0, 1), torch.arange(400), 500)
    assert abs(float(u.mean()) - 0.5) < 0.005 and abs(float(u.var()) - 1 / 12) < 0.002
    v = rng.uniform(rng.stream_key(0, 2), torch.arange(400), 500)
    assert float((u == v).float().mean()) < 0.001
    assert abs(float(torch.corrcoef(torch.stack([u[:, 0], u[:, 1]]))[0, 1])) < 0.15


def test_dropout_keeps_the_right_fraction_and_scales() -> None:
    m = rng.dropout_mask(rng.stream_key(5), torch.arange(1000), (300,), 0.6)
    assert abs(float((m > 0).float().mean()) - 0.4) < 0.005
    assert torch.allclose(m[m > 0], torch.tensor(2.5))


def test_draws_at_pairs_equal_the_dense_draws() -> None:
    key = rng.stream_key(1, 2)
    full = rng.draws16(key, torch.arange(30), 17, 5)
    r = torch.randint(0, 30, (200,))
    c = torch.randint(0, 17, (200,))
    assert torch.equal(rng.draws16_at(key, r, c + 5), full[r, c])


def test_dropout_mask_drawn_in_blocks_equals_one_draw(monkeypatch) -> None:
    """Blocks of rows (bounded temporaries) give the mask one draw over every row gives."""
    rows = torch.randperm(1000)[:300]
    whole = rng.dropout_mask(123, rows, (7, 3), 0.4, col_offset=5)
    monkeypatch.setattr(rng, "MASK_BLOCK", 50)  # 2 rows of 21 columns per block, the last block short
    assert torch.equal(rng.dropout_mask(123, rows, (7, 3), 0.4, col_offset=5), whole)
    keep = rng.draws16(123, rows, 21, 5) >= round(0.4 * 65536)
    assert torch.equal(whole.reshape(300, 21), keep.float() / 0.6)


def test_a_mask_off_the_cpu_is_drawn_in_few_blocks(monkeypatch) -> None:
    """Off the CPU a block costs its ~30 kernel launches, so a mask of 200,000 x 128 is drawn in 2 blocks, not the
    CPU's 196 (each of 2^17 elements, sized for the allocator's mmap threshold); the meta device stands in for a
    GPU: shapes only, the same code path."""
    calls = []
    real = rng.draws16
    monkeypatch.setattr(rng, "draws16", lambda *a, **k: calls.append(len(a[1])) or real(*a, **k))
    keep = rng.keep_mask(7, torch.arange(200_000, device="meta"), 128, 0.5)
    assert keep.shape == (200_000, 128) and keep.device.type == "meta"
    assert calls == [131_072, 68_928]
    calls.clear()
    rng.keep_mask(7, torch.arange(200_000), 128, 0.5)
    assert len(calls) == 196 and max(calls) == 1024


def test_dropout_equals_x_times_its_mask_forward_and_backward() -> None:
    x = torch.randn(257, 5, 3, dtype=torch.float32, requires_grad=True)
    rows = torch.arange(1000, 1257)
    out = rng.dropout(x, 77, rows, 0.3, col_offset=2)
    mask = rng.dropout_mask(77, rows, (5, 3), 0.3, col_offset=2)
    assert torch.equal(out, x * mask)
    g = torch.randn_like(out)
    out.backward(g)
    assert torch.equal(x.grad, g * mask)
