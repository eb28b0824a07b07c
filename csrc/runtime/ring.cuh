// The weight ring: shared-memory pages that a worker's loader warp fills with
// bulk async copies (cp.async.bulk, completing on an mbarrier) and that its
// consumer warps drain. The loader walks the worker's task queue ahead of the
// consumers and waits only for a free page, never for an event: weights are
// not written during a launch, so the next task's weights stream in while
// the consumers still wait for that task's inputs (docs/architecture.md,
// Runtime). So do a kv_pages attention's K and V rows (tasks/attention.cuh:
// a fresh-row attention reads no cache row the launch writes).
//
// Pages are numbered by one sequence per launch, shared by both sides: page
// `seq` lives in slot seq % P and is that slot's (seq / P)-th fill, so a
// side waits on a slot's barrier with parity (seq / P) & 1. A parity wait is
// only meaningful one phase ahead, so both sides take pages strictly in
// order: the loader fills page seq once page seq - P is released, and every
// consumer warp reads page seq only after it released page seq - 1.
#pragma once
#include <stdint.h>

namespace mpk {

constexpr int kPageBytes = 16384;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

// mbar_test reports whether the barrier's phase with this parity completed.
__device__ __forceinline__ bool mbar_test(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}


// mbar_expect_bytes arrives once and tells the barrier how many bytes of
// bulk copies must land before its phase completes.
__device__ __forceinline__ void mbar_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

// ld_shared_16 reads 16 bytes of shared memory (the ring's pages reach task
// code as generic pointers; a generic load of them is slower than LDS).
__device__ __forceinline__ uint4 ld_shared_16(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// bulk_load copies bytes (a multiple of 16, both addresses 16-byte aligned)
// from global to shared memory, completing on bar, under an L2 policy.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}

// box_load copies the box at (x, y) of a 2-D tensor map (global memory, as
// mpk_launch wrote it before the launch) to shared memory (128-byte aligned),
// completing on bar, under an L2 policy.
__device__ __forceinline__ void box_load(void* dst, const void* tmap, int x, int y, uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3}], "
      "[%4], %5;" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(x), "r"(y), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}

// box_load_3d copies the box at (x, y, z) of a 3-D tensor map, as box_load.
__device__ __forceinline__ void box_load_3d(void* dst, const void* tmap, int x, int y, int z, uint64_t* bar,
                                            uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3, "
      "%4}], [%5], %6;" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(x), "r"(y), "r"(z), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}

// box_load_4d copies the box at (x, y, z, w) of a 4-D tensor map (a split
// GEMM x's: tmaps.cuh's encode_split_x_map), as box_load.
__device__ __forceinline__ void box_load_4d(void* dst, const void* tmap, int x, int y, int z, int w, uint64_t* bar,
                                            uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3, "
      "%4, %5}], [%6], %7;" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(x), "r"(y), "r"(z), "r"(w), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}

// mbar_inval ends a barrier's use, so its bytes may serve as anything else.
__device__ __forceinline__ void mbar_inval(uint64_t* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// The barriers of a ring of P pages, in shared memory.
template <int P>
struct RingBars {
  uint64_t full[P];   // one arrival (the loader's expect) plus the page's bytes
  uint64_t empty[P];  // the consumers' releases (see Ring::init)
};

// Ring is a worker's view of its page ring: P pages of PAGE bytes at `pages`.
template <int P, int PAGE = kPageBytes>
struct Ring {
  static constexpr int kBytes = PAGE;
  RingBars<P>* bars;  // the empty barriers count one arrival per consumer warp
  char* pages;

  __device__ __forceinline__ char* page(uint32_t seq) const { return pages + (seq % P) * PAGE; }

  // init is called by one thread before any other use (then a block barrier).
  __device__ void init(int consumer_warps) const {
    for (int i = 0; i < P; ++i) {
      mbar_init(&bars->full[i], 1);
      mbar_init(&bars->empty[i], consumer_warps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }

  // Loader side: is page seq's slot free (drained by the consumers of page seq - P)?
  __device__ __forceinline__ bool slot_free(uint32_t seq) const {
    return seq < P || mbar_test(&bars->empty[seq % P], ((seq / P) + 1) & 1);
  }

  // Loader side (one thread): start filling page seq with bytes from src.
  __device__ __forceinline__ void fill(uint32_t seq, const void* src, uint32_t bytes, uint64_t policy) const {
    uint64_t* bar = &bars->full[seq % P];
    mbar_expect_bytes(bar, bytes);
    bulk_load(page(seq), src, bytes, bar, policy);
  }

  // Loader side (one thread): start filling page seq with `rows` segments of
  // seg bytes, row_bytes apart in src, one after another in the page (a tile
  // page: tasks/tiles.cuh).
  __device__ __forceinline__ void fill_rows(uint32_t seq, const char* src, int rows, int64_t row_bytes,
                                            uint32_t seg, uint64_t policy) const {
    uint64_t* bar = &bars->full[seq % P];
    mbar_expect_bytes(bar, rows * seg);
    for (int r = 0; r < rows; ++r) bulk_load(page(seq) + r * seg, src + r * row_bytes, seg, bar, policy);
  }

  // Loader side (one thread): start filling page seq as fill_rows would,
  // but column block after column block (a GEMM page: tasks/gemm.cuh's
  // gemm_page_at): each row's seg bytes as segments of block bytes, a
  // block's at block·page_rows bytes apart. One bulk copy a segment: the
  // fallback where a weight has no tensor map.
  __device__ __forceinline__ void fill_rows_blocked(uint32_t seq, const char* src, int rows, int64_t row_bytes,
                                                    uint32_t seg, uint32_t block, int page_rows,
                                                    uint64_t policy) const {
    uint64_t* bar = &bars->full[seq % P];
    mbar_expect_bytes(bar, rows * seg);
    for (uint32_t b = 0; b < seg; b += block)
      for (int r = 0; r < rows; ++r)
        bulk_load(page(seq) + b * page_rows + r * block, src + r * row_bytes + b, block, bar, policy);
  }

  // Loader side (one thread): start filling page seq with the box at (x, y)
  // of a tensor map (at (0, y, x) of a 3-D one: a box in column blocks),
  // bytes in all (the box's, rows past the matrix's end zero-filled and
  // counted alike).
  __device__ __forceinline__ void fill_box(uint32_t seq, const void* tmap, int x, int y, uint32_t bytes,
                                           uint64_t policy, bool blocks = false) const {
    uint64_t* bar = &bars->full[seq % P];
    mbar_expect_bytes(bar, bytes);
    if (blocks) box_load_3d(page(seq), tmap, 0, y, x, bar, policy);
    else box_load(page(seq), tmap, x, y, bar, policy);
  }

  // Has page seq landed? (the consumers before reading it; the loader to
  // bound the pages in flight)
  __device__ __forceinline__ bool ready(uint32_t seq) const {
    return mbar_test(&bars->full[seq % P], (seq / P) & 1);
  }

  // Consumer side, once per warp after its last read of page seq.
  __device__ __forceinline__ void release(uint32_t seq) const {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(&bars->empty[seq % P]);
  }
};

// A ring's layout in shared memory: its barriers, rounded up to 128 bytes,
// then its P pages.
template <int P>
constexpr int ring_bars_bytes() {
  return (int)((sizeof(RingBars<P>) + 127) / 128 * 128);
}

template <int P>
__device__ __forceinline__ Ring<P> ring_at(char* base) {
  return Ring<P>{reinterpret_cast<RingBars<P>*>(base), base + ring_bars_bytes<P>()};
}

}  // namespace mpk
