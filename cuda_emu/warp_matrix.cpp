// The emulated tensor-core instructions (warp_matrix.h): mma and ldmatrix as warp exchanges (block.cpp calls the
// compute functions below once per warp, on the last lane's fiber), cp.async as per-thread deferred copies.
#include "cuda_emu/warp_matrix.h"

#include <bit>
#include <cstring>
#include <string>

#include "cuda_emu/emulator.h"
#include "cuda_emu/scheduler.h"

namespace minidl::emu::detail {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

struct MmaLane {
  float* d;
  const uint32_t* a;
  const uint32_t* b;
  const float* c;
};

float low_half(uint32_t r, MmaInput type) {
  const uint16_t bits = static_cast<uint16_t>(r & 0xffffu);
  return type == MmaInput::kBF16 ? __bfloat162float(std::bit_cast<__nv_bfloat16>(bits))
                                 : __half2float(std::bit_cast<__half>(bits));
}
float high_half(uint32_t r, MmaInput type) { return low_half(r >> 16, type); }

// The fragment layouts of the PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating point type"), with
// g = lane >> 2 (groupID) and t = lane % 4 (threadID_in_group):
//   A (16 x 16, row): register i holds row g + 8 * (i & 1), columns 2t + 8 * (i >> 1) and the next one
//   B (16 x 8, col):  register i holds rows 2t + 8 * i and the next one, column g
//   C, D (16 x 8):    element i is row g + 8 * (i >> 1), column 2t + (i & 1)
template <MmaInput kType>
void mma_compute(void* const* lanes, unsigned mask) {
  if (mask != kFullMask) fatal("mma.sync.aligned.m16n8k16 needs all 32 lanes of the warp, got mask 0x%08x", mask);
  float A[16][16], Bt[8][16], C[16][8];  // B transposed so the inner product runs over contiguous memory
  for (int lane = 0; lane < 32; ++lane) {
    const MmaLane& l = *static_cast<const MmaLane*>(lanes[lane]);
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i & 1), col = 2 * t + 8 * (i >> 1);
      A[row][col] = low_half(l.a[i], kType);
      A[row][col + 1] = high_half(l.a[i], kType);
    }
    for (int i = 0; i < 2; ++i) {
      Bt[g][2 * t + 8 * i] = low_half(l.b[i], kType);
      Bt[g][2 * t + 8 * i + 1] = high_half(l.b[i], kType);
    }
    for (int i = 0; i < 4; ++i) C[g + 8 * (i >> 1)][2 * t + (i & 1)] = l.c[i];
  }
  // Products of 16-bit values are exact in f32; the sum runs in f32 like the tensor core's (whose order and
  // rounding of the partial sums differ in the last bits: tests compare with tolerances).
  for (int lane = 0; lane < 32; ++lane) {
    const MmaLane& l = *static_cast<const MmaLane*>(lanes[lane]);
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
      float sum = 0.0f;
      for (int k = 0; k < 16; ++k) sum += A[row][k] * Bt[col][k];
      l.d[i] = C[row][col] + sum;
    }
  }
}

constexpr WarpExchange kMmaF16{"mma.sync.aligned.m16n8k16.f16", mma_compute<MmaInput::kF16>};
constexpr WarpExchange kMmaBF16{"mma.sync.aligned.m16n8k16.bf16", mma_compute<MmaInput::kBF16>};

struct LdmatrixLane {
  const unsigned char* row;
  uint32_t* regs;
};

// Matrix m is rows lanes[8m .. 8m+7].row, eight 16-bit elements each. Without .trans lane l receives, of each
// matrix, row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1; with .trans, column l / 4, rows 2 (l % 4) and the next.
template <int kMatrices, bool kTrans>
void ldmatrix_compute(void* const* lanes, unsigned mask) {
  if (mask != kFullMask) fatal("ldmatrix.sync.aligned needs all 32 lanes of the warp, got mask 0x%08x", mask);
  uint16_t m8x8[kMatrices][8][8];
  for (int m = 0; m < kMatrices; ++m)
    for (int r = 0; r < 8; ++r) std::memcpy(m8x8[m][r], static_cast<const LdmatrixLane*>(lanes[8 * m + r])->row, 16);
  for (int lane = 0; lane < 32; ++lane) {
    uint32_t* regs = static_cast<const LdmatrixLane*>(lanes[lane])->regs;
    const int a = lane / 4, b = 2 * (lane % 4);
    for (int m = 0; m < kMatrices; ++m) {
      const uint16_t lo = kTrans ? m8x8[m][b][a] : m8x8[m][a][b];
      const uint16_t hi = kTrans ? m8x8[m][b + 1][a] : m8x8[m][a][b + 1];
      regs[m] = uint32_t{lo} | uint32_t{hi} << 16;
    }
  }
}

constexpr WarpExchange kLdmatrix[2][3] = {{{"ldmatrix.x1", ldmatrix_compute<1, false>},
                                           {"ldmatrix.x2", ldmatrix_compute<2, false>},
                                           {"ldmatrix.x4", ldmatrix_compute<4, false>}},
                                          {{"ldmatrix.x1.trans", ldmatrix_compute<1, true>},
                                           {"ldmatrix.x2.trans", ldmatrix_compute<2, true>},
                                           {"ldmatrix.x4.trans", ldmatrix_compute<4, true>}}};

std::string where(const std::source_location& site) {
  return std::string(site.file_name()) + ":" + std::to_string(site.line());
}

}  // namespace

void mma_m16n8k16(MmaInput type, float* d, const uint32_t* a, const uint32_t* b, const float* c,
                  const std::source_location& site) {
  MmaLane lane{d, a, b, c};
  warp_exchange(type == MmaInput::kBF16 ? kMmaBF16 : kMmaF16, kFullMask, &lane, site);
}

void ldmatrix(int matrices, bool trans, uint32_t* regs, const void* row, const std::source_location& site) {
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0)
    fatal("ldmatrix at %s: row address %p is not 16-byte aligned", where(site).c_str(), row);
  const int which = matrices == 1 ? 0 : matrices == 2 ? 1 : 2;
  LdmatrixLane lane{static_cast<const unsigned char*>(row), regs};
  warp_exchange(kLdmatrix[trans][which], kFullMask, &lane, site);
}

void cp_async(void* dst, const void* src, int bytes, const std::source_location& site) {
  if (bytes != 16 || reinterpret_cast<uintptr_t>(dst) % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0)
    fatal("cp.async.cg at %s: needs 16 bytes between 16-byte aligned addresses, got %d bytes from %p to %p",
          where(site).c_str(), bytes, src, dst);
  AsyncCopy copy{static_cast<unsigned char*>(dst), {}, bytes};
  check_access(src, 16, false, __builtin_return_address(0));
  std::memcpy(copy.bytes, src, 16);
  std::memset(dst, 0xFF, 16);
  async_copies_of_current_thread().pending.push_back(copy);
}

void cp_async_commit() {
  AsyncCopies& copies = async_copies_of_current_thread();
  copies.committed_ends.push_back(copies.pending.size());
}

void cp_async_wait(int pending) {
  AsyncCopies& copies = async_copies_of_current_thread();
  const int groups = static_cast<int>(copies.committed_ends.size());
  if (groups <= pending) return;
  const size_t landed = copies.committed_ends[groups - pending - 1];
  for (size_t i = 0; i < landed; ++i) {
    check_access(copies.pending[i].dst, 16, true, __builtin_return_address(0));
    std::memcpy(copies.pending[i].dst, copies.pending[i].bytes, 16);
  }
  copies.pending.erase(copies.pending.begin(), copies.pending.begin() + static_cast<std::ptrdiff_t>(landed));
  copies.committed_ends.erase(copies.committed_ends.begin(), copies.committed_ends.begin() + (groups - pending));
  for (size_t& end : copies.committed_ends) end -= landed;
}

}  // namespace minidl::emu::detail
