"""The cuda target on a GPU (pytest -m gpu): tiny models through one megakernel
launch per step, judged by the bf16 rule (docs/architecture.md) against a float32 copy."""

from __future__ import annotations

import re

import pytest
import torch

from mpk import check, models
from mpk.errors import ArgumentError
from mpk.models import cache_kw

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen3", "small-llama", "small-qwen3"])
def test_cuda_steps_bf16_rule(core_lib, fresh_dynamo, model):
    lines = []
    res = check.run_check(model=model, target="cuda", steps=8, seed=0, log=lines.append)
    assert res.ok, "\n".join(lines)
    assert res.compiles == 1, "\n".join(lines)
    assert lines[-1].startswith("PASS rel_err=")


@pytest.mark.parametrize("model", ["wide-qwen3", "wide-llama"])
@pytest.mark.parametrize("prefill", [1, 33])
def test_cuda_rope_rows_of_128(core_lib, fresh_dynamo, model, prefill):
    """RoPE on rows of 128, half a warp a row (tasks/generic.cuh
    rope_lane_rows), with Qwen3's q/k norm (wide-qwen3) and without
    (wide-llama, a decode step's rows; a chunk's go through rope_rows): a
    decode step, and a 33-token chunk whose KV-head tasks end on an odd row
    (the warp's other half repeats it and stores nothing)."""
    lines = []
    res = check.run_check(model=model, target="cuda", dtype="bfloat16", prefill=prefill, cache_tokens=16,
                          steps=2, seed=0, log=lines.append)
    assert res.ok, "\n".join(lines)


def test_cuda_long_cache_mostly_empty(core_lib, fresh_dynamo):
    """300 live positions in a cache of 1,024, with a mask: the chunks past
    the mask's extent are skipped on the GPU, and (16 workers) the live ones
    are interleaved over the tasks, not in split order."""
    lines = []
    res = check.run_check(model="small-llama", target="cuda", cache_tokens=300, capacity=1024, steps=4, seed=0,
                          workers=16, log=lines.append, mask=True)
    assert res.ok, "\n".join(lines)


@pytest.mark.parametrize("cache_tokens,capacity", [(700, 1024), (1000, 1024), (700, 774)])
def test_cuda_kv_pages_long_chunks(core_lib, fresh_dynamo, cache_tokens, capacity):
    """kv_pages' long-cache layout: a cache of 1,024 on 6 workers takes 3
    chunks of 342 positions (3 ring pages of K and 3 of V a task), a unit of
    both of a KV head's query heads, each warp several 32-row blocks of the
    chunk; at 700 live the last chunk is partly past the mask's extent. A
    cache of 774 takes chunks of 258: one round of a head's 8 warps (256
    rows) and 2 rows, which two warps take one each (MPK_DECODE_TAIL_ROWS;
    the last chunk's 2 past the mask's extent)."""
    lines = []
    res = check.run_check(model="small-llama", target="cuda", cache_tokens=cache_tokens, capacity=capacity, steps=4,
                          seed=0, workers=6, log=lines.append, mask=True)
    assert res.ok, "\n".join(lines)
    assert res.summary["tasks_by_op"]["rope+attention"] == 6 * 2, res.summary["tasks_by_op"]


@pytest.mark.parametrize("model,batch,cache_tokens,capacity", [("wide-llama", 4, 300, 0), ("wide-llama", 8, 200, 0),
                                                               ("wide-qwen3", 3, 300, 0), ("wide-llama", 4, 300, 1200),
                                                               ("small-llama", 4, 300, 0), ("small-llama", 8, 200, 1200)])
def test_cuda_kv_pages_batch(core_lib, fresh_dynamo, model, batch, cache_tokens, capacity):
    """kv_pages_batch on the GPU: a masked decode batch's attention as
    kv_pages tasks, one row's KV head over a chunk each (two chunks a (row,
    KV head) cell on 16 workers), its K and V pages alternating through the
    ring and taken a round of 128 rows at a time (mpk::KVPages' STREAM:
    chunks of 150-600 rows through a ring of fewer pages); head dim 128
    (wide-llama, wide-qwen3: 2 pages of K and 2 of V a round) on the lanes,
    64 (small-llama) on the tensor cores (kv_batch_mma); at a capacity of
    1,200 the second chunk of each cell lies past the mask's extent (no live
    unit: its pages are only released)."""
    lines = []
    res = check.run_check(model=model, target="cuda", batch=batch, cache_tokens=cache_tokens, capacity=capacity, steps=3,
                          seed=0, workers=16, log=lines.append, mask=True, options={"kv_pages_batch": True})
    assert res.ok, "\n".join(lines)
    assert "mpk::attention_kv_pages<" in res.compiled.sources["module.cu"]


@pytest.mark.parametrize("model,batch,cache_tokens,capacity", [("small-llama", 4, 300, 0), ("small-llama", 8, 200, 1200),
                                                               ("wide-llama", 8, 200, 0), ("wide-qwen3", 3, 300, 0)])
def test_cuda_kv_swizzle(core_lib, fresh_dynamo, model, batch, cache_tokens, capacity):
    """kv_swizzle (off by default) on the GPU: a masked decode batch's kv_pages
    chunks land as boxes of the caches' tensor maps, 128-byte swizzled, and
    the tensor-core rounds read them at the swizzled addresses: head dim 64
    (small-llama: one 128-byte block a row) and 128 (wide-llama, wide-qwen3:
    two blocks a page), a chunk's last page past its rows (the box lands
    whole), a capacity past the mask's extent, two tasks a worker (16)."""
    lines = []
    res = check.run_check(model=model, target="cuda", batch=batch, cache_tokens=cache_tokens, capacity=capacity, steps=3,
                          seed=0, workers=16, log=lines.append, mask=True, options={"kv_swizzle": True})
    assert res.ok, "\n".join(lines)
    assert "kKVLive, true, true, true>(op, lo, hi, s, c)" in res.compiled.sources["module.cu"], "no swizzled kv pages"


@pytest.mark.parametrize("batch,workers,mask", [(4, None, False), (3, 16, True), (8, 16, False), (24, 16, False)])
def test_cuda_batch_on_tensor_cores(core_lib, fresh_dynamo, batch, workers, mask):
    """Several rows of x stream each weight once through the tensor cores
    (mpk::linear_tiles): odd and full row counts, tasks of one row group (132
    workers) and of several (16 workers), with a mask; x split into hi + lo
    (up to 8 rows an m-tile), and at 24 rows too large for that, rounded (16
    rows an m-tile, the second partial)."""
    lines = []
    res = check.run_check(model="wide-llama", target="cuda", batch=batch, workers=workers, mask=mask, steps=4,
                          seed=0, log=lines.append)
    assert res.ok, "\n".join(lines)
    src = res.compiled.sources["module.cu"]
    assert "mpk::linear_tiles<" in src and "mpk::linear<" not in src, "every Linear should take the tensor cores"


@pytest.mark.parametrize("batch,prefill", [(48, 1), (1, 48)])
def test_cuda_split_rows(core_lib, fresh_dynamo, batch, prefill):
    """split_rows (on by default) on the GPU: wide-llama's down projection (x 48 x 1,536) as
    blocks of rows through mpk::linear_tiles, on views that start past row 0 (split_k off:
    it would cut this Linear along K first)."""
    lines = []
    res = check.run_check(model="wide-llama", target="cuda", batch=batch, prefill=prefill, cache_tokens=16, steps=2,
                          seed=0, workers=16, log=lines.append, mask=prefill > 1,
                          options={"split_k": False, "gemm": False})
    assert res.ok, "\n".join(lines)
    assert res.compiled.sources["module.cu"].count("mpk::linear_tiles<") >= 2


@pytest.mark.parametrize("mask", [False, True])
def test_cuda_prefill_rows(core_lib, fresh_dynamo, mask):
    """prefill_rows on the GPU: a 24-token prompt chunk's attention as decode
    over its queries (K and V broadcast over the rows, q and the output
    through permuted views), with and without left padding."""
    lines = []
    res = check.run_check(model="wide-llama", target="cuda", prefill=24, cache_tokens=40, steps=2, seed=0,
                          workers=16, log=lines.append, mask=mask, options={"prefill_rows": True})
    assert res.ok, "\n".join(lines)
    assert "mpk::attn_merge_decode<" in res.compiled.sources["module.cu"]


@pytest.mark.parametrize("model,batch", [("long-mlp-llama", 32), ("wide-llama", 48)])
def test_cuda_split_k(core_lib, fresh_dynamo, model, batch):
    """split_k (on by default) on the GPU: tile streams over a slice of each weight row
    (row_span < row_bytes), 4 or 3 slices side by side, and the sum of their fp32 products."""
    lines = []
    res = check.run_check(model=model, target="cuda", batch=batch, cache_tokens=16, steps=2, seed=0,
                          workers=16, log=lines.append, options={"gemm": False})
    assert res.ok, "\n".join(lines)
    assert "linear_k_sum+residual" in res.summary.get("op_labels", [])


@pytest.mark.parametrize("batch,workers", [(16, 32), (8, 64)])
def test_cuda_tile_x_parts(core_lib, fresh_dynamo, batch, workers):
    """tile_x_parts (on by default) on the GPU: long-mlp-llama's down
    projection (K 4,096) stages x in two halves of K, the loader sending its
    pages part by part. At batch 16 x is rounded and a task reads 16 weight
    rows (two row groups, each summed across the parts); at batch 8 x keeps
    its low part and a task reads 8 rows."""
    lines = []
    res = check.run_check(model="long-mlp-llama", target="cuda", batch=batch, cache_tokens=16, steps=2, seed=0,
                          workers=workers, log=lines.append, options={"tile_x_parts": True})
    assert res.ok, "\n".join(lines)
    assert "mpk::NoPro, mpk::NoEpi, 2>(op, lo, hi, s, c)" in res.compiled.sources["module.cu"]


@pytest.mark.parametrize("workers", [32, 132])
def test_cuda_wide_x_parts(core_lib, fresh_dynamo, tmp_path, workers):
    """wide_x_parts (off by default) on the GPU: a hidden size of 2,048 at
    batch 16 stages every tile stream's x in two parts of K: the normed x of
    q/k/v and of the gate and up pair through the deferred norm (each part's
    sums of squares added into the rows' pads, the dots scaled in the store),
    tasks of many row groups adding each part's sums in shared memory (32
    workers: 64 rows of gate and of up a task), of at most two in registers."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from test_build import wide_x_config
    lines = []
    res = check.run_check(model=wide_x_config(tmp_path / "cfg"), target="cuda", batch=16, cache_tokens=16, steps=2,
                          seed=0, workers=workers, log=lines.append, options={"wide_x_parts": True})
    assert res.ok, "\n".join(lines)
    src = res.compiled.sources["module.cu"]
    assert any("mpk::NormPro, mpk::PairEpi<" in ln and ", 2>(op, lo, hi, s, c)" in ln for ln in src.splitlines()), \
        "the pair's x is not staged in parts"


@pytest.mark.parametrize("model,batch,workers", [("wide-llama", 8, 64), ("long-mlp-llama", 16, 32)])
def test_cuda_pair_tiles(core_lib, fresh_dynamo, model, batch, workers):
    """pair_tiles (on by default) on the GPU: a decode batch's gate and up
    tile streams pair, a task staging x once and taking each row group's
    pages of the gate's weight, then of the up's, their products meeting in
    SiLU(gate)·up. wide-llama at batch 8 (K 1,024: a page a row group),
    long-mlp-llama at batch 16 (K 512: two m-tiles of x's hi and lo)."""
    lines = []
    res = check.run_check(model=model, target="cuda", batch=batch, cache_tokens=16, steps=2, seed=0,
                          workers=workers, log=lines.append, options={"pair_tiles": True})
    assert res.ok, "\n".join(lines)
    src = res.compiled.sources["module.cu"]
    assert any("mpk::linear_tiles<" in ln and "mpk::PairEpi<" in ln for ln in src.splitlines()), \
        "no paired tile stream in the module"


@pytest.mark.parametrize("model,batch,prefill,workers,mask", [
    ("wide-llama", 1, 64, None, True), ("wide-llama", 1, 64, 16, False),
    ("wide-llama", 48, 1, 16, False), ("long-mlp-llama", 32, 1, 16, False), ("wide-llama", 1, 128, 16, True)])
def test_cuda_gemm(core_lib, fresh_dynamo, model, batch, prefill, workers, mask):
    """gemm (on by default) on the GPU, on mma.sync (wgmma off): Linears whose x
    is too large to stage whole stream it a block of K at a time (mpk::linear_gemm): a 64-token
    chunk (4 m-tiles, every Linear, k and v cut along K on 16 workers, q and o
    too on 132), 48 rows (an m-tile past x's rows), 32 (one warp row, eight
    column warps) and a 128-token chunk (blocks of 64 rows, split_rows), with
    and without a mask."""
    lines = []
    res = check.run_check(model=model, target="cuda", batch=batch, prefill=prefill, cache_tokens=16, steps=2,
                          seed=0, workers=workers, log=lines.append, mask=mask, options={"wgmma": False})
    assert res.ok, "\n".join(lines)
    assert "mpk::linear_gemm<" in res.compiled.sources["module.cu"]


@pytest.mark.parametrize("workers", [None, 16])
def test_cuda_gemm_row_blocks(core_lib, fresh_dynamo, workers):
    """gemm_row_blocks (on by default) on the GPU: a 64-token chunk's GEMM
    streams that would be cut along K (k and v on 16 workers; q, k, v and o
    on 132) run over 2 blocks of 32 rows of x, K whole, with no sum op
    (gemm_siblings off: each cut as if it ran alone; timed_schedule off: it
    cuts the down projection along K)."""
    lines = []
    res = check.run_check(model="wide-llama", target="cuda", prefill=64, cache_tokens=16, steps=2, seed=0,
                          workers=workers, log=lines.append, mask=True,
                          options={"gemm_row_blocks": True, "gemm_siblings": False, "timed_schedule": False})
    assert res.ok, "\n".join(lines)
    assert not any(l.startswith("linear_k_sum") for l in res.summary.get("op_labels", [])), res.summary.get("op_labels")


def test_cuda_gemm_siblings(core_lib, fresh_dynamo):
    """gemm_siblings (on by default) on the GPU: on 16 workers a 64-token
    chunk's q, k and v run uncut, their 32 wgmma tasks of 64 weight rows
    side by side (test_check_gemm_siblings; timed_schedule off: it cuts the
    down projection along K)."""
    lines = []
    res = check.run_check(model="wide-llama", target="cuda", dtype="bfloat16", prefill=64, cache_tokens=16, steps=2,
                          seed=0, workers=16, log=lines.append, mask=True, options={"timed_schedule": False})
    assert res.ok, "\n".join(lines)
    labels = res.summary.get("op_labels", [])
    assert labels.count("linear") == 3 * 2 + 1 and "linear_k_sum" not in labels, labels


def test_cuda_timed_schedule(core_lib, fresh_dynamo):
    """timed_schedule (on by default) on the GPU: on 16 workers a 64-token
    chunk's down projection runs as K slices beside the gate/up pair's short
    last round, the pair keeps its tail, and the GEMM tasks sit on the
    workers a timed schedule gives them (test_check_timed_schedule)."""
    lines = []
    res = check.run_check(model="wide-llama", target="cuda", dtype="bfloat16", prefill=64, cache_tokens=16, steps=2,
                          seed=0, workers=16, log=lines.append, mask=True)
    assert res.ok, "\n".join(lines)
    labels = res.summary.get("op_labels", [])
    assert sum(l.startswith("pair:linear") for l in labels) == 2, labels
    assert sum(l.startswith("linear_k_sum") for l in labels) == 2, labels


@pytest.mark.parametrize("model,batch,prefill,workers,options", [
    ("wide-llama", 1, 64, None, {"wgmma": False}), ("wide-llama", 48, 1, 16, {"wgmma": False}),
    ("long-mlp-llama", 32, 1, 16, {"wgmma": False}), ("wide-llama", 1, 48, 16, {"pair_gemm": True, "wgmma": False})])
def test_cuda_gemm_two_mtiles(core_lib, fresh_dynamo, monkeypatch, model, batch, prefill, workers, options):
    """MPK_GEMM_WARP_MTILES=2 (an A/B knob; 1 by default) on the GPU: GEMM
    streams whose warps take two m-tiles of x each (the warp split of 64
    rows: 2 warps of m-tiles x 2 pages x 4 column warps), a pair's too, with
    the bf16 rule."""
    monkeypatch.setenv("MPK_NVCC_EXTRA", "-DMPK_GEMM_WARP_MTILES=2")  # part of the build cache's key
    lines = []
    res = check.run_check(model=model, target="cuda", batch=batch, prefill=prefill, cache_tokens=16, steps=2, seed=0,
                          workers=workers, log=lines.append, mask=prefill > 1, options=options)
    assert res.ok, "\n".join(lines)
    assert "mpk::linear_gemm<" in res.compiled.sources["module.cu"]


@pytest.mark.parametrize("extra,options", [("-DMPK_TMA_PAGES=0", {"wgmma": False}),
                                           ("-DMPK_GEMM_BLOCKED_PAGES=0", {"wgmma": False})])
def test_cuda_gemm_page_fills(core_lib, fresh_dynamo, monkeypatch, extra, options):
    """A GEMM page's other fills on the GPU (by default one 3-D tensor-map box
    in column blocks, mpk::gemm_page_at): without tensor maps, a bulk copy
    of 64 bytes a row and column block (the path of a weight no map can
    describe); and MPK_GEMM_BLOCKED_PAGES=0 (an A/B knob: pages of whole
    rows, one 2-D box), a 48-token chunk with a pair on 16 workers, with the
    bf16 rule. (wgmma streams read only swizzled tensor-map boxes: a module
    with one does not build with either knob.)"""
    monkeypatch.setenv("MPK_NVCC_EXTRA", extra)  # part of the build cache's key
    lines = []
    res = check.run_check(model="wide-llama", target="cuda", prefill=48, cache_tokens=16, steps=2, seed=0,
                          workers=16, log=lines.append, mask=True, options=options)
    assert res.ok, "\n".join(lines)
    assert "mpk::PairEpi<" in res.compiled.sources["module.cu"]


@pytest.mark.parametrize("prefill,workers", [(64, None), (64, 16), (48, 16), (32, 16)])
def test_cuda_pair_gemm(core_lib, fresh_dynamo, prefill, workers):
    """pair_gemm (on by default) on the GPU, on mma.sync (wgmma off; test_cuda_wgmma
    pairs on wgmma): a prompt chunk's gate and up
    GEMM streams as one (mpk::linear_gemm with a PairEpi: four pages a block,
    the gate's rows then the up's), 64 rows on 132 and 16 workers, 48 (an
    m-tile past x's rows) and 32 (one warp row, four column warps), with the
    bf16 rule. (A longer chunk's blocks of rows do not pair: each block's
    gate writes a part of one temporary that pairLinears sees whole; nor do
    wide-llama's gate and up on 132 workers, cut along K to keep every
    worker busy, which the check runs all the same.)"""
    lines = []
    res = check.run_check(model="wide-llama", target="cuda", prefill=prefill, cache_tokens=16, steps=2, seed=0,
                          workers=workers, log=lines.append, mask=True, options={"pair_gemm": True, "wgmma": False})
    assert res.ok, "\n".join(lines)
    paired = re.search(r"mpk::linear_gemm<[^;]*mpk::PairEpi<", res.compiled.sources["module.cu"])
    assert bool(paired) == (workers is not None), "pair_gemm paired where it cannot, or not where it can"


@pytest.mark.parametrize("prefill,workers", [(64, None), (64, 16), (128, 16)])
def test_cuda_round_gemm_inputs(core_lib, fresh_dynamo, prefill, workers):
    """round_gemm_inputs (off by default) on the GPU: a prompt chunk's GEMM
    streams read x in bf16 (mpk::linear_gemm with no low part), 64 rows and
    a 128-token chunk in blocks of 64, with the bf16 rule."""
    lines = []
    res = check.run_check(model="wide-llama", target="cuda", prefill=prefill, cache_tokens=16, steps=2, seed=0,
                          workers=workers, log=lines.append, mask=True, options={"round_gemm_inputs": True})
    assert res.ok, "\n".join(lines)
    lows = re.findall(r"mpk::linear_gemm<[^,]+, \d+, \d+, (true|false),", res.compiled.sources["module.cu"])
    assert lows and set(lows) == {"false"}, lows  # the template's LO: x staged with a low part


@pytest.mark.parametrize("rows_mma", [False, True])
def test_cuda_long_attention_chunks(core_lib, fresh_dynamo, monkeypatch, rows_mma):
    """long_attention_chunks (on by default) on the GPU: a 64-token chunk's
    attention over 272 positions in 2 chunks of 136 a layer on 16 workers,
    each task reading 3 tiles of K and V one after another, on the scalar
    body (MPK_ROWS_MMA=0) and on the tensor cores (the default)."""
    monkeypatch.setenv("MPK_NVCC_EXTRA", f"-DMPK_ROWS_MMA={int(rows_mma)}")  # part of the build cache's key
    lines = []
    res = check.run_check(model="wide-llama", target="cuda", prefill=64, cache_tokens=16, capacity=272, steps=2,
                          seed=0, workers=16, log=lines.append, mask=True, options={"long_attention_chunks": True})
    assert res.ok, "\n".join(lines)
    assert res.summary["tasks_by_op"]["attention"] == 2 * 16 * 2, res.summary["tasks_by_op"]


@pytest.mark.parametrize("model,batch,prefill,workers,mask", [
    ("wide-llama", 1, 64, None, True), ("wide-llama", 48, 1, 16, False), ("long-mlp-llama", 32, 1, 16, False),
    ("wide-llama", 1, 128, 16, True)])
def test_cuda_wgmma(core_lib, fresh_dynamo, model, batch, prefill, workers, mask):
    """wgmma (on by default) on the GPU: test_cuda_gemm's steps with the GEMM
    streams on Hopper's wgmma (mpk::linear_wgmma: x as A from registers,
    64-row swizzled pages as B): 64 tokens, 48 rows and 32 (tokens past x's
    rows: A rows whose products are never stored), and a 128-token chunk in
    blocks of 64, with and without a mask; gate and up paired. (split_gemm_x
    off: x split in registers, as for an x another op reads;
    test_cuda_split_gemm_x runs the default.)"""
    lines = []
    res = check.run_check(model=model, target="cuda", batch=batch, prefill=prefill, cache_tokens=16, steps=2,
                          seed=0, workers=workers, log=lines.append, mask=mask,
                          options={"wgmma": True, "split_gemm_x": False})
    assert res.ok, "\n".join(lines)
    src = res.compiled.sources["module.cu"]
    assert "mpk::linear_wgmma<" in src and "mpk::linear_gemm<" not in src


@pytest.mark.parametrize("model,batch,prefill,workers,mask", [
    ("wide-llama", 1, 64, None, True), ("wide-llama", 48, 1, 16, False), ("long-mlp-llama", 32, 1, 16, False),
    ("wide-llama", 1, 128, 16, True), ("wide-qwen3", 1, 33, None, True)])
def test_cuda_split_gemm_x(core_lib, fresh_dynamo, model, batch, prefill, workers, mask):
    """split_gemm_x (on by default) on the GPU: test_cuda_wgmma's steps with
    every GEMM stream's x stored as bf16 hi and lo planes by the norm, the
    attention merge and the gate/up pair's epilogue, and staged by tensor-map
    copies as wgmma's B (mpk::linear_wgmma_split): 64 tokens, 48 rows and 32
    (x's boxes of 64 and 32 rows, the rows past x's zero-filled), a 128-token
    chunk in blocks of 64, and a 33-token qwen3 chunk, with the bf16 rule."""
    lines = []
    res = check.run_check(model=model, target="cuda", batch=batch, prefill=prefill, cache_tokens=16, steps=2,
                          seed=0, workers=workers, log=lines.append, mask=mask, options={"split_gemm_x": True})
    assert res.ok, "\n".join(lines)
    xs = re.findall(r"mpk::linear_wgmma<[^;]*, (true|false)>\(", res.compiled.sources["module.cu"])
    assert "true" in xs, xs  # the template's XS (an x some other op reads or writes is not split)


@pytest.mark.parametrize("model,batch", [("wide-llama", 4), ("wide-llama", 8), ("wide-qwen3", 16), ("wide-llama", 24)])
def test_cuda_gemm_batch(core_lib, fresh_dynamo, model, batch):
    """gemm_batch on the GPU: a decode batch's Linears whose tasks cover the
    16 workers as wgmma GEMM streams of x's split rows in boxes of 8, 16 and
    32 rows (wgmma's N 16, 32 and 64; the rows past the batch's
    zero-filled), or of an fp32 x that a tile stream reads too, beside the
    tile streams of the narrow ones, with the bf16 rule."""
    lines = []
    res = check.run_check(model=model, target="cuda", batch=batch, cache_tokens=16, steps=2, seed=0, workers=16,
                          log=lines.append, options={"gemm_batch": True})
    assert res.ok, "\n".join(lines)
    src = res.compiled.sources["module.cu"]
    assert re.search(rf"mpk::linear_wgmma<__nv_bfloat16, \d+, {batch}, [^;]*, true>\(", src), "no split wgmma stream"


@pytest.mark.parametrize("model,batch,prefill,mask", [("wide-llama", 1, 64, True), ("wide-llama", 64, 1, False)])
def test_cuda_balance_gemm_tail(core_lib, fresh_dynamo, model, batch, prefill, mask):
    """balance_gemm_tail (on by default) on the GPU: on 16 workers the
    paired gate and up streams' last round (8 of 24 tasks) runs as two
    paired streams over 32 rows of x each (stacked hi and lo), beside the
    first rounds' stream: a 64-token chunk and a batch of 64 (timed_schedule
    off: it cuts the down projection into K slices beside that round)."""
    lines = []
    res = check.run_check(model=model, target="cuda", dtype="bfloat16", batch=batch, prefill=prefill, cache_tokens=16,
                          steps=2, seed=0, workers=16, log=lines.append, mask=mask, options={"timed_schedule": False})
    assert res.ok, "\n".join(lines)
    labels = res.summary.get("op_labels", [])
    assert sum(l.startswith("pair:linear") for l in labels) == 6, labels


def test_cuda_long_prompt_chunk(core_lib, fresh_dynamo):
    """A 320-token chunk with a mask on the GPU: GEMM streams over blocks of
    64 rows, the merge split by rows (attn_merge_decode's split_dim 0), the
    mask's ops by rows."""
    lines = []
    res = check.run_check(model="wide-llama", target="cuda", prefill=320, cache_tokens=16, steps=1, seed=0,
                          workers=16, log=lines.append, mask=True)
    assert res.ok, "\n".join(lines)
    assert "mpk::linear_wgmma<" in res.compiled.sources["module.cu"]  # (the default: bf16 weights, an fp32 x)


def test_cuda_prompt_chunk_over_a_long_cache(core_lib, fresh_dynamo):
    """A 64-token chunk after 300 cached tokens in a cache of 4,096 on 16
    workers: the attention's tasks are bounded (32 a worker: 4 KV heads x 4
    blocks of rows x 32 chunks), so each chunk of 128 positions is read into
    shared memory a tile of 64 after another, and no tile past the rows'
    extents is read."""
    lines = []
    res = check.run_check(model="wide-llama", target="cuda", prefill=64, cache_tokens=300, capacity=4096, steps=2,
                          seed=0, workers=16, log=lines.append)
    assert res.ok, "\n".join(lines)
    assert "mpk::attention_rows<__nv_bfloat16, float, float, 128, 2, 64>" in res.compiled.sources["module.cu"]


@pytest.mark.parametrize("model,prefill,cache_tokens,capacity,mask", [
    ("small-llama", 32, 64, 0, False), ("small-llama", 48, 40, 0, True), ("small-llama", 64, 300, 1024, False),
    ("tiny-llama", 16, 20, 0, True), ("wide-llama", 64, 300, 4096, True)])
def test_cuda_rows_mma(core_lib, fresh_dynamo, monkeypatch, model, prefill, cache_tokens, capacity, mask):
    """attention_rows on the tensor cores (MPK_ROWS_MMA=1, the default; head dims 64, 16
    and 128, the last in two parts of 64 columns): prompt chunks of 16 to 64
    rows, with and without a mask, and over long caches whose chunks take
    several tiles of 64 positions."""
    monkeypatch.setenv("MPK_NVCC_EXTRA", "-DMPK_ROWS_MMA=1")  # part of the build cache's key
    lines = []
    res = check.run_check(model=model, target="cuda", prefill=prefill, cache_tokens=cache_tokens, capacity=capacity,
                          steps=2, seed=0, workers=16, log=lines.append, mask=mask)
    assert res.ok, "\n".join(lines)
    assert "mpk::attention_rows<" in res.compiled.sources["module.cu"]


def _compiled_tiny_llama(options=None):
    check.ensure_backend_registered()
    m = models.build("tiny-llama", dtype=torch.bfloat16, device="cuda", seed=0)
    gen = torch.Generator().manual_seed(1)
    fill = torch.randint(0, m.config.vocab_size, (1, 64), generator=gen)
    cache = check._make_cache(m, 128, "cuda", fill)
    compiled = []  # the compiled callables, through the on_compile option
    cm = torch.compile(m, backend="mpk", options={"target": "cuda", "on_compile": compiled.append, **(options or {})},
                       fullgraph=True, dynamic=False)
    toks = [torch.randint(0, m.config.vocab_size, (1, 1), generator=gen).cuda() for _ in range(6)]
    return cm, cache, toks, compiled


@torch.no_grad()
def test_one_kernel_launch_per_step(core_lib, fresh_dynamo):
    from torch.profiler import ProfilerActivity, profile

    cm, cache, toks, compiled = _compiled_tiny_llama()
    for t in toks[:2]:  # compile, then one warm step
        cm(input_ids=t, **cache_kw(cache), use_cache=True)
    torch.cuda.synchronize()
    fn = compiled[-1]
    before = fn.launches
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for t in toks[2:5]:
            cm(input_ids=t, **cache_kw(cache), use_cache=True)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.lower().startswith(("memcpy", "memset"))]
    assert fn.launches - before == 3
    assert len(kernels) == 3, kernels
    assert len(compiled) == 1 and fn.calls == 5


@torch.no_grad()
def test_arguments_are_checked_on_cuda(core_lib, fresh_dynamo):
    cm, cache, toks, compiled = _compiled_tiny_llama()
    cm(input_ids=toks[0], **cache_kw(cache), use_cache=True)
    fn = compiled[-1]
    metas = [i["meta"] for i in fn.inputs]
    good = [torch.empty_strided(m["shape"], m["strides"], dtype=_dtype(m["dtype"]), device=fn.device)
            for m in metas]
    bad = list(good)
    bad[-1] = bad[-1].cpu()
    with pytest.raises(ArgumentError, match=r"argument %d .* is on cpu" % (len(bad) - 1)):
        fn(*bad)
    bad = list(good)
    bad[0] = torch.empty(3, device=fn.device)
    with pytest.raises(ArgumentError, match="argument 0"):
        fn(*bad)


def _dtype(name: str) -> torch.dtype:
    from mpk import export
    return export.DTYPES_BY_NAME[name]


@torch.no_grad()
def test_timings_and_cache_hit(core_lib, fresh_dynamo, monkeypatch, tmp_path):
    """A cold compile into an empty cache, then a warm one that hits all three
    caches (exported graph, core result, nvcc module) and still runs."""
    monkeypatch.setenv("MPK_CACHE_DIR", str(tmp_path))
    cm, cache, toks, compiled = _compiled_tiny_llama({"sync": True})
    cm(input_ids=toks[0], **cache_kw(cache), use_cache=True)
    first = compiled[-1]
    assert first.core_ms > 0 and first.load_s >= 0 and not first.build.cache_hit
    assert "core" in first.timing() and first.front_timing.startswith("AOTAutograd ")
    torch._dynamo.reset()
    cm, cache, toks, compiled = _compiled_tiny_llama({"sync": True})
    cm(input_ids=toks[0], **cache_kw(cache), use_cache=True)
    second = compiled[-1]
    assert second is not first and second.build.cache_hit and second.nvcc_s is None
    assert second.summary.get("core_cache_hit") and "core cache hit" in second.timing()
    assert second.front_timing == "AOTAutograd skipped (graph cache hit)"
    assert second.last_status is not None and second.last_status["aborted"] == 0


@torch.no_grad()
def test_broken_graph_raises_instead_of_hanging(core_lib, fresh_dynamo):
    """A graph with a wait that can never be satisfied (validator skipped) must
    abort on its spin budget and raise, not hang the GPU."""
    import time

    from mpk.errors import MpkError

    cm, cache, toks, _ = _compiled_tiny_llama({"skip_validate": True, "drop_dependency": True, "sync": True})
    with pytest.raises(MpkError) as first:  # compiles (nvcc), launches, aborts
        cm(input_ids=toks[0], **cache_kw(cache), use_cache=True)
    assert "wait" in str(first.value).lower() and "event" in str(first.value).lower(), str(first.value)
    t0 = time.perf_counter()
    with pytest.raises(MpkError):  # compiled already: only the launch and the abort
        cm(input_ids=toks[1], **cache_kw(cache), use_cache=True)
    assert time.perf_counter() - t0 < 1.0
    # The GPU is still usable afterwards.
    assert float(torch.ones(4, device="cuda").sum()) == 4.0


@torch.no_grad()
def test_hf_generate_with_mpk_compile_config(core_lib, fresh_dynamo):
    """HF generate with a static cache and CompileConfig(backend="mpk") gives
    the same 32 greedy tokens as eager generate (tiny-llama, float32)."""
    from transformers import CompileConfig

    check.ensure_backend_registered()
    m = models.build("tiny-llama", dtype=torch.float32, device="cuda", seed=0)
    ids = torch.randint(0, m.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(3)).cuda()
    kw = dict(max_new_tokens=32, do_sample=False, cache_implementation="static", pad_token_id=0)
    eager = m.generate(ids, disable_compile=True, **kw)
    compiled = []
    cfg = CompileConfig(backend="mpk", fullgraph=True, dynamic=False, mode=None,
                        options={"target": "cuda", "on_compile": compiled.append})
    got = m.generate(ids, compile_config=cfg, **kw)
    assert compiled, "generate did not compile through mpk"
    assert got.shape == eager.shape and torch.equal(got, eager), (got, eager)


@pytest.mark.parametrize("bad,op,index", [("cache", "kv_write", "10"), ("token", "embedding", "256")])
def test_index_out_of_range_raises(core_lib, fresh_dynamo, bad, op, index):
    """A KV write past the cache's end and a token id at the vocabulary size
    raise MpkRuntimeError naming the op and the index (the launch aborts with
    MPK_ABORT_INDEX instead of skipping the write), and the process goes on
    compiling and running."""
    from mpk.errors import MpkRuntimeError
    from test_errors import _index_error_steps
    with pytest.raises(MpkRuntimeError) as e:
        _index_error_steps("cuda", "cuda", bad)
    assert op in str(e.value) and f"index {index}" in str(e.value), str(e.value)
    res = check.run_check(model="tiny-llama", target="cuda", dtype="bfloat16", steps=2, log=lambda s: None)
    assert res.ok


def _decode_steps(step, cache, toks):
    """Logits (float32, on the CPU) of one decode call per token, in order."""
    out = []
    for t in toks:
        out.append(step(input_ids=t, **cache_kw(cache), use_cache=True).logits.float().cpu())
    return out


@torch.no_grad()
def test_cuda_graph_capture_replays_the_step(core_lib, fresh_dynamo):
    """A decode step captured with torch.cuda.graph and replayed 32 times gives
    the logits and the KV cache of 32 direct calls (the kernel is deterministic:
    equal to the bit)."""
    check.ensure_backend_registered()
    m, cache = check.decode_setup("tiny-llama", 16, extra=40)
    state = check.snapshot(cache)
    gen = torch.Generator().manual_seed(5)
    toks = [torch.randint(0, m.config.vocab_size, (1, 1), generator=gen).cuda() for _ in range(32)]
    cm = torch.compile(m, backend="mpk", options={"target": "cuda"}, fullgraph=True, dynamic=False)
    cm(input_ids=toks[0], **cache_kw(cache), use_cache=True)  # compile and warm, outside the capture
    check.restore(cache, state)
    direct = _decode_steps(cm, cache, toks)
    direct_cache = check.snapshot(cache)

    check.restore(cache, state)
    static_tok = toks[0].clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm the capture's allocations on a side stream, as torch.cuda.graph wants
        cm(input_ids=static_tok, **cache_kw(cache), use_cache=True)
    torch.cuda.current_stream().wait_stream(s)
    check.restore(cache, state)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = cm(input_ids=static_tok, **cache_kw(cache), use_cache=True)
    check.restore(cache, state)  # capturing ran nothing; start the replays from the same cache
    replayed = []
    for t in toks:
        static_tok.copy_(t)
        g.replay()
        replayed.append(out.logits.float().cpu())
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(replayed, direct))
    for a, b in zip(check.snapshot(cache), direct_cache):
        assert torch.equal(a["keys"], b["keys"]) and torch.equal(a["values"], b["values"])


@pytest.mark.parametrize("streams", [1, 2])
@torch.no_grad()
def test_two_instances_of_one_module_interleave(core_lib, fresh_dynamo, streams):
    """Two identically configured models with different weights compile to the
    same module (one build) but two instances: decoding them interleaved for 16
    steps, on one stream or on two, each matches its own eager run (float32,
    TF32 off)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    check.ensure_backend_registered()
    runs = []
    for seed in (0, 1):
        m, cache = check.decode_setup("tiny-llama", 16, dtype=torch.float32, seed=seed, extra=20)
        state = check.snapshot(cache)
        gen = torch.Generator().manual_seed(10 + seed)
        toks = [torch.randint(0, m.config.vocab_size, (1, 1), generator=gen).cuda() for _ in range(16)]
        eager = _decode_steps(m, cache, toks)
        check.restore(cache, state)
        compiled = []
        cm = torch.compile(m, backend="mpk", options={"target": "cuda", "on_compile": compiled.append},
                           fullgraph=True, dynamic=False)
        runs.append(dict(cm=cm, cache=cache, toks=toks, eager=eager, compiled=compiled, got=[],
                         stream=torch.cuda.Stream() if streams == 2 else torch.cuda.current_stream()))
    for r in runs:  # the caches were restored on the default stream
        r["stream"].wait_stream(torch.cuda.current_stream())
    for i in range(16):
        for r in runs:
            with torch.cuda.stream(r["stream"]):
                r["got"].append(r["cm"](input_ids=r["toks"][i], **cache_kw(r["cache"]), use_cache=True).logits)
    torch.cuda.synchronize()
    a, b = runs
    assert len(a["compiled"]) == 1 and len(b["compiled"]) == 1, "each model compiles once, to its own callable"
    assert a["compiled"][0].build.path == b["compiled"][0].build.path  # one module ...
    assert a["compiled"][0].instance is not b["compiled"][0].instance  # ... two instances
    for r in runs:
        errs = [check.rel_err(g.float().cpu(), e) for g, e in zip(r["got"], r["eager"])]
        assert max(errs) <= 1e-3, errs


@pytest.mark.parametrize("model,batch", [("small-llama", 1), ("wide-llama", 3)])
def test_cuda_arena_reuse_is_bit_identical(core_lib, fresh_dynamo, model, batch):
    """arena_reuse moves temporaries onto bytes earlier ones held (the
    validator proves every task of one ordered before every task of the
    other); the kernels, their order and their arithmetic stay the same, and
    the task library has no atomics, so 4 decode steps give the same logits
    and cache, bit for bit, with and without it. A race the sharing opened
    would show as a difference."""
    check.ensure_backend_registered()
    m, cache = check.decode_setup(model, 64, extra=8, batch=batch)
    state = check.snapshot(cache)
    gen = torch.Generator().manual_seed(5)
    toks = [torch.randint(0, m.config.vocab_size, (batch, 1), generator=gen).cuda() for _ in range(4)]
    runs = {}
    for reuse in (True, False):
        torch._dynamo.reset()
        check.restore(cache, state)
        compiled = []
        step = torch.compile(m, backend="mpk", fullgraph=True, dynamic=False,
                             options={"target": "cuda", "arena_reuse": reuse, "on_compile": compiled.append})
        logits = check._steps(step, cache, toks, "cuda")
        runs[reuse] = (logits, [t.clone() for layer in check.snapshot(cache) for t in layer.values()
                                if isinstance(t, torch.Tensor)], compiled[0].summary["arena_bytes"])
    (got, got_cache, shared), (want, want_cache, apart) = runs[True], runs[False]
    assert shared < apart, (shared, apart)
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), f"step {i}: logits differ with arena_reuse"
    for g, w in zip(got_cache, want_cache):
        assert torch.equal(g, w), "the cache differs with arena_reuse"


def test_cuda_loss_and_cumsum(core_lib, fresh_dynamo):
    """log_softmax, nll_loss (a loss for labels, ignore_index rows included)
    and cumsum (HF's packed-sequence detection) on the GPU, float32."""
    import torch.nn.functional as F

    def f(x, t):
        seq = (t.diff(dim=-1, prepend=t[:1] - 1) != 1).cumsum(-1)
        return F.cross_entropy(x * 2, t.clamp(max=10).masked_fill(t == 4, -100)), seq * 3

    check.ensure_backend_registered()
    x = torch.randn(6, 11, device="cuda")
    t = torch.tensor([3, 4, 10, 0, 1, 2], device="cuda")
    got = torch.compile(f, backend="mpk", options={"target": "cuda"}, fullgraph=True, dynamic=False)(x, t)
    want = f(x, t)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(got[1], want[1])


def test_cuda_composite_ops(core_lib, fresh_dynamo):
    """test_ops' composite reductions and activations, all in one graph on
    the GPU (float32), against eager."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from test_ops import _COMPOSITES, _X

    def f(x):
        out = []
        for k in sorted(_COMPOSITES):
            r = _COMPOSITES[k](x)
            out += list(r) if isinstance(r, tuple) else [r]
        return out

    check.ensure_backend_registered()
    x = _X.cuda()
    got = torch.compile(f, backend="mpk", options={"target": "cuda"}, fullgraph=True, dynamic=False)(x)
    for g, w in zip(got, f(x)):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, equal_nan=True)
