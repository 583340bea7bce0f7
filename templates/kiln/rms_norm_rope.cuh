// LTX-Video's attention prologue in one pass: for each token, q and k are RMS-normalised
// over their whole width with their own weights (x * rsqrt(mean(x^2) + eps) * weight,
// rounded to T as the separate norm would), then rotated in interleaved pairs over the
// whole width with cos/sin from a table row (TABLE = float or T) or computed from the
// token's video coordinates (VIDEO). Math in fp32.
//
// HEAD_DIM = 0: a table row holds one angle a column of the row (LTX-Video's). HEAD_DIM = D:
// it holds D / 2 angles, one a rotation pair of a head, the same for every head of D columns
// (Wan's tables, read at the columns its rotation reads); the family keeps a vector inside one
// head.
//
// A token's q row and k row are split among THREADS_PER_ROW threads, each holding its
// vectors of both in registers through the reductions (as loaded, so 16-bit data takes half
// the registers of floats, which keeps more tokens in flight per SM), so q and k are read
// exactly once; interleaved pairs never straddle a vector, so rotation needs no data from
// other threads. Tokens number below 2^31 (the host checks), so a token's batch entry and
// position come from 32-bit division, not the far costlier 64-bit one.
//
// In one pass with coordinates, a token's cos/sin are computed before the reductions and
// parked in shared memory (kStash), so that the barrier does not hold them back. Its tokens in
// flight per SM are then bounded by registers, which MIN_CTAS can lower (the family's
// min_ctas).
//
// PREFETCH (a persistent grid, a few CTAs per SM): each thread loads its next token's q and
// k while it normalises and rotates the current one, so an SM's loads stay in flight through
// the reductions and the angle math, and the per-thread video frequencies are computed once
// per CTA for many tokens instead of for one.
#pragma once

#include "kiln/common.cuh"
#include "kiln/dependent_launch.cuh"
#include "kiln/rope_angles.cuh"
#include "kiln/rope_params.cuh"

namespace kiln {

// MIN_CTAS > 0 asks ptxas for registers few enough that an SM holds that many CTAs (the
// family offers it to the one-pass kernel that parks its angles); 0 leaves ptxas its choice.
template <typename T, typename TABLE, int WIDTH, int VEC_BYTES, int THREADS_PER_ROW,
          int CTA_THREADS, bool VIDEO, bool PREFETCH, int MIN_CTAS, int HEAD_DIM = 0>
__global__ void __launch_bounds__(CTA_THREADS, MIN_CTAS) rms_norm_rope(const RmsNormRopeParams p) {
  begin_dependent_grid();
  constexpr int kVec = VEC_BYTES / static_cast<int>(sizeof(T));
  constexpr int kStride = kVec * THREADS_PER_ROW;
  constexpr int kSteps = (WIDTH + kStride - 1) / kStride;
  constexpr bool kExact = WIDTH % kStride == 0;
  constexpr int kRowsPerCta = CTA_THREADS / THREADS_PER_ROW;
  constexpr float kInvWidth = 1.0f / WIDTH;
  static_assert(kVec >= 2 && kVec % 2 == 0, "interleaved pairs must not straddle vectors");
  static_assert(WIDTH % kVec == 0, "rows must be made of whole vectors");
  static_assert(CTA_THREADS % THREADS_PER_ROW == 0, "rows must tile the CTA");
  static_assert(HEAD_DIM == 0 || (!VIDEO && HEAD_DIM % kVec == 0 && WIDTH % HEAD_DIM == 0),
                "a table of each head's pairs: vectors inside one head of the row");

  const int lane = static_cast<int>(threadIdx.x) % THREADS_PER_ROW;
  const int row_in_cta = static_cast<int>(threadIdx.x) / THREADS_PER_ROW;

  VideoPairs<VIDEO ? kSteps : 1, VIDEO ? kVec / 2 : 1, THREADS_PER_ROW> video_pairs;
  // One pass whose reductions cross warps: a token's cos/sin are computed while its loads are
  // in flight and parked in shared memory across the barrier, each thread's in its own slots
  // (at most 16 KB a CTA, so that shared memory does not cap the CTAs an SM holds before
  // registers do). Held in registers instead, ptxas computes them after the barrier, once the
  // data has arrived (an H200, [2, 8064, 2048], v16.t128.c128: 1.097x a same-size copy's
  // time -> 1.070x). A persistent grid's next token's, parked the same way, ran slower (1.07x
  // -> 1.15x): its loads are in flight through the barrier anyway.
  constexpr int kPairs = kSteps * (kVec / 2);
  constexpr bool kStash =
      VIDEO && !PREFETCH && THREADS_PER_ROW > 32 && kPairs * CTA_THREADS * sizeof(float2) <= 16384;
  static_assert(MIN_CTAS == 0 || kStash, "an occupancy is asked only of the parking kernel");
  __shared__ float2 stash[kStash ? kPairs : 1][kStash ? CTA_THREADS : 1];
  const auto stash_cos_sin = [&](unsigned position) {
    float axes[3];
    video_pairs.rotate_axes(p.video, position, axes);
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
#pragma unroll
      for (int i = 0; i < kVec / 2; ++i) {
        float2 cos_sin;
        video_pairs.cos_sin(step, i, axes, cos_sin.x, cos_sin.y);
        stash[step * (kVec / 2) + i][threadIdx.x] = cos_sin;
      }
    }
  };

  constexpr int kWords = VEC_BYTES < 4 ? 1 : VEC_BYTES / 4;
  const unsigned seq_len = static_cast<unsigned>(p.seq_len);
  // A token's batch entry and position, found when its vectors are loaded and kept for its
  // rotation (a persistent grid's next token is found once, not twice).
  struct Place {
    unsigned entry;
    unsigned position;
  };
  // A token's q and k vectors, zero past the row's end and for a row past the last.
  const auto load_token = [&](long long row, Raw<VEC_BYTES>(&qv)[kSteps],
                              Raw<VEC_BYTES>(&kv)[kSteps]) {
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
#pragma unroll
      for (int w = 0; w < kWords; ++w) qv[step].words[w] = kv[step].words[w] = 0u;
    }
    Place place{0u, 0u};
    if (row >= p.rows) return place;
    place.entry = quotient(static_cast<unsigned>(row), p.seq_len_divisor);
    place.position = static_cast<unsigned>(row) - place.entry * seq_len;
    const T* q_row =
        static_cast<const T*>(p.q) + place.entry * p.q_strides[0] + place.position * p.q_strides[1];
    const T* k_row =
        static_cast<const T*>(p.k) + place.entry * p.k_strides[0] + place.position * p.k_strides[1];
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      const int column = (step * THREADS_PER_ROW + lane) * kVec;
      if (kExact || step + 1 < kSteps || column < WIDTH) {
        qv[step] = load_global_nc<VEC_BYTES>(q_row + column);
        kv[step] = load_global_nc<VEC_BYTES>(k_row + column);
      }
    }
    return place;
  };

  // The normalised, rotated token at `place` (its q and k vectors and their norms' scales)
  // stored.
  const auto rotate_token = [&](Place place, float q_scale, float k_scale,
                                const Raw<VEC_BYTES>(&qv)[kSteps],
                                const Raw<VEC_BYTES>(&kv)[kSteps]) {
    const unsigned entry = place.entry;
    const unsigned position = place.position;

    float axes[3];
    if constexpr (VIDEO && !kStash) video_pairs.rotate_axes(p.video, position, axes);
    const TABLE* cos_row =
        static_cast<const TABLE*>(p.cos) + entry * p.cos_strides[0] + position * p.cos_strides[1];
    const TABLE* sin_row =
        static_cast<const TABLE*>(p.sin) + entry * p.sin_strides[0] + position * p.sin_strides[1];
    T* q_out =
        static_cast<T*>(p.q_out) + entry * p.q_out_strides[0] + position * p.q_out_strides[1];
    T* k_out =
        static_cast<T*>(p.k_out) + entry * p.k_out_strides[0] + position * p.k_out_strides[1];
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      const int column = (step * THREADS_PER_ROW + lane) * kVec;
      if (!(kExact || step + 1 < kSteps || column < WIDTH)) continue;
      float c[kVec], s[kVec];
      if constexpr (VIDEO) {
#pragma unroll
        for (int i = 0; i < kVec / 2; ++i) {
          if constexpr (kStash) {
            const float2 cos_sin = stash[step * (kVec / 2) + i][threadIdx.x];
            c[2 * i] = cos_sin.x;
            s[2 * i] = cos_sin.y;
          } else {
            video_pairs.cos_sin(step, i, axes, c[2 * i], s[2 * i]);
          }
          c[2 * i + 1] = c[2 * i];
          s[2 * i + 1] = s[2 * i];
        }
      } else if constexpr (HEAD_DIM > 0) {
        const int angle = (column % HEAD_DIM) / 2;
        float half_c[kVec / 2], half_s[kVec / 2];
        load_table<TABLE, kVec / 2, VEC_BYTES / 2>(cos_row + angle, half_c);
        load_table<TABLE, kVec / 2, VEC_BYTES / 2>(sin_row + angle, half_s);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          c[i] = half_c[i / 2];
          s[i] = half_s[i / 2];
        }
      } else {
        load_table<TABLE, kVec, VEC_BYTES>(cos_row + column, c);
        load_table<TABLE, kVec, VEC_BYTES>(sin_row + column, s);
      }
      const Raw<VEC_BYTES> qw =
          load_global_nc<VEC_BYTES>(static_cast<const T*>(p.q_weight) + column);
      const Raw<VEC_BYTES> kw =
          load_global_nc<VEC_BYTES>(static_cast<const T*>(p.k_weight) + column);
      float q_result[kVec], k_result[kVec];
#pragma unroll
      for (int i = 0; i < kVec; i += 2) {
        // The separate norm's output is rounded to T before the rotation reads it.
        float q_re = get_element<T>(qv[step], i) * q_scale * get_element<T>(qw, i);
        float q_im = get_element<T>(qv[step], i + 1) * q_scale * get_element<T>(qw, i + 1);
        float k_re = get_element<T>(kv[step], i) * k_scale * get_element<T>(kw, i);
        float k_im = get_element<T>(kv[step], i + 1) * k_scale * get_element<T>(kw, i + 1);
        round_through<T>(q_re, q_im);
        round_through<T>(k_re, k_im);
        q_result[i] = q_re * c[i] - q_im * s[i];
        q_result[i + 1] = q_im * c[i + 1] + q_re * s[i + 1];
        k_result[i] = k_re * c[i] - k_im * s[i];
        k_result[i + 1] = k_im * c[i + 1] + k_re * s[i + 1];
      }
      store_floats<T, VEC_BYTES>(q_out + column, q_result);
      store_floats<T, VEC_BYTES>(k_out + column, k_result);
    }
  };

  const long long grid_rows = static_cast<long long>(gridDim.x) * kRowsPerCta;
  long long first_row = static_cast<long long>(blockIdx.x) * kRowsPerCta;
  if (first_row >= p.rows) return;  // the whole CTA
  long long row = first_row + row_in_cta;
  Raw<VEC_BYTES> qv[kSteps];
  Raw<VEC_BYTES> kv[kSteps];
  // The first token's loads go out before the video frequencies are computed, so a CTA spends
  // its setup waiting on memory, not before asking it.
  Place place = load_token(row, qv, kv);
  if constexpr (VIDEO) video_pairs.init(p.video, lane);
  if constexpr (kStash) stash_cos_sin(place.position);
  int parity = 0;  // group_sums' buffer
  // Every thread runs the same iterations (the reductions may synchronise the CTA).
  for (;;) {
    const bool active = row < p.rows;
    Raw<VEC_BYTES> q_next[PREFETCH ? kSteps : 1];
    Raw<VEC_BYTES> k_next[PREFETCH ? kSteps : 1];
    Place next_place{0u, 0u};
    if constexpr (PREFETCH) next_place = load_token(row + grid_rows, q_next, k_next);
    float squares[2] = {0.0f, 0.0f};  // q's, k's
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      float qp = 0.0f, kp = 0.0f;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float qe = get_element<T>(qv[step], i);
        const float ke = get_element<T>(kv[step], i);
        qp += qe * qe;
        kp += ke * ke;
      }
      squares[0] += qp;
      squares[1] += kp;
    }
    group_sums<THREADS_PER_ROW, CTA_THREADS>(squares, parity);
    parity ^= 1;
    const float q_scale = rsqrtf(squares[0] * kInvWidth + p.eps);
    const float k_scale = rsqrtf(squares[1] * kInvWidth + p.eps);
    if (active) rotate_token(place, q_scale, k_scale, qv, kv);
    if constexpr (PREFETCH) {
      place = next_place;
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        qv[step] = q_next[step];
        kv[step] = k_next[step];
      }
    }
    // Without a persistent grid the host launches a covering grid, which rows below 2^31
    // (the host checks) never outgrow: one pass.
    if constexpr (!PREFETCH) break;
    first_row += grid_rows;
    row += grid_rows;
    if (first_row >= p.rows) break;
  }
}

}  // namespace kiln
