// Half-split RoPE (rope.cuh's formulas, forward or INVERSE, full or HALF_TABLE tables) over whole
// vectors of each row, for heads whose rotated half is not a whole number of the data's widest
// vectors: Qwen3-VL's 72-wide heads (halves of 72 bytes in bf16) and MiniMax-M3-VL's 78 rotated
// of 80 (halves of 78 bytes). kiln::rope gives a thread a vector and its partner R/2 further, so
// there every access is as narrow as the half's alignment: 8 bytes for 72, 2 for 78. Here a
// thread owns VEC_BYTES vectors of a row's HEAD_DIM columns and reads and writes each whole;
// each element's partner (R/2 away) comes in chunks of the widest access that both halves hold
// whole. Those are bytes of the same row, brought into L1 by the row's own vector loads, so DRAM
// sees whole vectors. The unrotated columns pass through.
//
// A row's HEAD_DIM / vector vectors go to as many neighbouring threads of a CTA, and each of
// those threads takes the same vector of ROWS consecutive rows, so a CTA covers CTA_THREADS /
// (HEAD_DIM / vector) groups of ROWS rows whole (the threads past them idle). Rows follow
// memory: heads inner, row r is head r % heads of token r / heads (entry-major); positions
// inner, position r % seq of head (r / seq) % heads of entry r / (seq * heads). With
// SHARED_TABLE (heads inner, the heads a multiple of ROWS: the host's head-count flags say so)
// a group's rows are one token's, and its thread reads their cos/sin once.
//
// In place, a thread reads partners that other threads of its CTA overwrite: the CTA's loads
// all land before any of its stores (one barrier, taken only in place), and the data is read
// through the coherent path.
#pragma once

#include "kiln/common.cuh"
#include "kiln/dependent_launch.cuh"
#include "kiln/rope_angles.cuh"
#include "kiln/rope_params.cuh"

namespace kiln {

__host__ __device__ constexpr int rope_gcd(int a, int b) {
  return b == 0 ? a : rope_gcd(b, a % b);
}

template <typename T, typename TABLE, int HEAD_DIM, int ROTARY_DIM, int VEC_BYTES, int TABLE_BYTES,
          int CTA_THREADS, int ROWS, bool SHARED_TABLE, bool INVERSE, bool HALF_TABLE>
__global__ void __launch_bounds__(CTA_THREADS) rope_flat(const RopeParams p) {
  begin_dependent_grid();
  constexpr int kVec = VEC_BYTES / static_cast<int>(sizeof(T));
  constexpr int kHalf = ROTARY_DIM / 2;
  constexpr int kRowVecs = HEAD_DIM / kVec;
  constexpr int kGroups = CTA_THREADS / kRowVecs;   // a CTA's groups of ROWS rows
  constexpr int kTables = SHARED_TABLE ? 1 : ROWS;  // cos/sin rows a thread reads
  // A partner chunk: elements that lie on one side of R/2 in a vector and in its partner.
  constexpr int kPart = rope_gcd(kVec, kHalf);
  constexpr int kPartBytes = kPart * static_cast<int>(sizeof(T));
  // Table chunks: columns contiguous in the table, at most its alignment. A half table's
  // columns restart at R/2, and the inverse reads sin at the partners' columns, so those take
  // partner chunks; a full table's cos (and the forward's sin) run on to R.
  constexpr int kTableAligned = TABLE_BYTES / static_cast<int>(sizeof(TABLE));
  constexpr int kTableWidest = 16 / static_cast<int>(sizeof(TABLE));
  constexpr int kTableMost = kTableAligned < kTableWidest ? kTableAligned : kTableWidest;
  constexpr int kWhole = HALF_TABLE ? kPart : rope_gcd(kVec, ROTARY_DIM);
  constexpr int kCos = kWhole < kTableMost ? kWhole : kTableMost;
  constexpr int kSin = INVERSE ? (kPart < kTableMost ? kPart : kTableMost) : kCos;
  static_assert(VEC_BYTES % sizeof(T) == 0 && HEAD_DIM % kVec == 0, "a row is whole vectors");
  static_assert(ROTARY_DIM % 2 == 0 && ROTARY_DIM <= HEAD_DIM, "a half-split rotated part");
  static_assert(kGroups >= 1, "a CTA covers at least one row");
  static_assert(kCos >= 1 && kSin >= 1, "a table chunk holds an element");

  const unsigned heads = static_cast<unsigned>(p.heads_q + p.heads_k);
  const bool positions_inner = p.positions_inner != 0;
  const int group = static_cast<int>(threadIdx.x) / kRowVecs;
  const int column = (static_cast<int>(threadIdx.x) - group * kRowVecs) * kVec;
  const long long first_row = (static_cast<long long>(blockIdx.x) * kGroups + group) * ROWS;

  T* out[ROWS];  // null: no row (past the CTA's groups or the last row)
  Raw<VEC_BYTES> x[ROWS];
  Raw<kPartBytes> partner[ROWS][kVec / kPart];
  float c[kTables][kVec];
  float s[kTables][kVec];

#pragma unroll
  for (int j = 0; j < ROWS; ++j) {
    out[j] = nullptr;
    const long long row = first_row + j;
    if (group >= kGroups || row >= p.rows) continue;
    const unsigned r = static_cast<unsigned>(row);
    unsigned head, position, entry;
    if (positions_inner) {
      const unsigned entry_head = quotient(r, p.seq_divisor);
      position = r - entry_head * static_cast<unsigned>(p.seq);
      entry = quotient(entry_head, p.heads_divisor);
      head = entry_head - entry * heads;
    } else {
      const unsigned token = quotient(r, p.heads_divisor);
      head = r - token * heads;
      entry = quotient(token, p.seq_divisor);
      position = token - entry * static_cast<unsigned>(p.seq);
    }
    const bool is_q = head < static_cast<unsigned>(p.heads_q);
    const unsigned h = is_q ? head : head - static_cast<unsigned>(p.heads_q);
    const long long* in_strides = is_q ? p.q_strides : p.k_strides;
    const long long* out_strides = is_q ? p.q_out_strides : p.k_out_strides;
    const T* in_row = static_cast<const T*>(is_q ? p.q : p.k) + entry * in_strides[0] +
                      position * in_strides[1] + h * in_strides[2];
    out[j] = static_cast<T*>(is_q ? p.q_out : p.k_out) + entry * out_strides[0] +
             position * out_strides[1] + h * out_strides[2];
    x[j] = load_global<VEC_BYTES>(in_row + column);
#pragma unroll
    for (int k = 0; k < kVec / kPart; ++k) {
      const int at = column + k * kPart;
      if (at < ROTARY_DIM) {
        partner[j][k] = load_global<kPartBytes>(in_row + (at < kHalf ? at + kHalf : at - kHalf));
      }
    }
    if (SHARED_TABLE && j > 0) continue;
    const int t = SHARED_TABLE ? 0 : j;
    const TABLE* cos_row =
        static_cast<const TABLE*>(p.cos) + entry * p.cos_strides[0] + position * p.cos_strides[1];
    const TABLE* sin_row =
        static_cast<const TABLE*>(p.sin) + entry * p.sin_strides[0] + position * p.sin_strides[1];
#pragma unroll
    for (int k = 0; k < kVec / kCos; ++k) {
      const int at = column + k * kCos;
      if (at < ROTARY_DIM) {
        const int from = HALF_TABLE && at >= kHalf ? at - kHalf : at;
        load_table<TABLE, kCos, kCos* static_cast<int>(sizeof(TABLE))>(cos_row + from,
                                                                       c[t] + k * kCos);
      }
    }
#pragma unroll
    for (int k = 0; k < kVec / kSin; ++k) {
      const int at = column + k * kSin;
      if (at < ROTARY_DIM) {
        // The inverse takes each element's sin at its partner's column (rope.cuh).
        const int other = INVERSE ? (at < kHalf ? at + kHalf : at - kHalf) : at;
        const int from = HALF_TABLE && other >= kHalf ? other - kHalf : other;
        load_table<TABLE, kSin, kSin* static_cast<int>(sizeof(TABLE))>(sin_row + from,
                                                                       s[t] + k * kSin);
      }
    }
  }
  // In place, partners are other threads' columns: every load of the CTA lands before a store.
  if (p.q_out == p.q || p.k_out == p.k) __syncthreads();

#pragma unroll
  for (int j = 0; j < ROWS; ++j) {
    if (out[j] == nullptr) continue;
    const int t = SHARED_TABLE ? 0 : j;
    float result[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const int at = column + i;
      const float value = get_element<T>(x[j], i);
      if (at < ROTARY_DIM) {
        const float other = get_element<T>(partner[j][i / kPart], i % kPart);
        // rope.cuh's expressions: a * c - b * s and b * c + a * s (forward), a * c + b * s and
        // b * c - a * s (inverse), a the first half's element and b the second's.
        const bool first = at < kHalf;
        result[i] = (first != INVERSE) ? value * c[t][i] - other * s[t][i]
                                       : value * c[t][i] + other * s[t][i];
      } else {
        result[i] = value;
      }
    }
    store_floats<T, VEC_BYTES>(out[j] + column, result);
  }
}

}  // namespace kiln
