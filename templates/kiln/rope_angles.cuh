// Where rotary angles come from, shared by kiln::rope and kiln::rms_norm_rope: a cos/sin
// table row (fp32 or the data's dtype), or LTX-Video's angles computed from a token's
// video coordinates (see RopeVideoGrid).
#pragma once

#include "kiln/common.cuh"
#include "kiln/rope_params.cuh"

namespace kiln {

// N consecutive elements of a table of C, widened to fp32, in loads of CHUNK_BYTES
// (the data's vector width, or one element when that is narrower).
template <typename C, int N, int CHUNK_BYTES>
__device__ __forceinline__ void load_table(const C* source, float* values) {
  constexpr int kChunk =
      CHUNK_BYTES < static_cast<int>(sizeof(C)) ? static_cast<int>(sizeof(C)) : CHUNK_BYTES;
  constexpr int kPerChunk = kChunk / static_cast<int>(sizeof(C));
  static_assert(N % kPerChunk == 0, "a table vector is whole chunks");
#pragma unroll
  for (int chunk = 0; chunk < N / kPerChunk; ++chunk) {
    const Raw<kChunk> r = load_global_nc<kChunk>(source + chunk * kPerChunk);
#pragma unroll
    for (int i = 0; i < kPerChunk; ++i) values[chunk * kPerChunk + i] = get_element<C>(r, i);
  }
}

// The frequency of LTX-Video's frequency index `index` (pair j past the padding has index
// j / 3): theta ** (index / (n - 1)) as torch computes it in fp32 (linspace then pow), times
// pi / 2. The exponent is at least -log2(theta) / (n - 1) (index -1 stands for the padding,
// whose frequency is then set to 0), so the result is a normal number, for which
// exp2_flushed gives the bits exp2f does.
__device__ __forceinline__ float video_frequency(const RopeVideoGrid& grid, int index) {
  return exp2_flushed(static_cast<float>(index) * grid.log2_freq_step) * 1.57079632679489662f;
}

// 2 * coordinate * scale - 1 for each axis of the token at `position` (below 2^31: the
// quotients are 32-bit).
__device__ __forceinline__ void video_axes(const RopeVideoGrid& grid, unsigned position,
                                           float* axes) {
  const unsigned width = static_cast<unsigned>(grid.width);
  const unsigned line = quotient(position, grid.width_divisor);  // frame * height + row
  const unsigned height = static_cast<unsigned>(grid.height);
  const unsigned frame = quotient(line, grid.height_divisor);
  const float coordinate[3] = {static_cast<float>(frame), static_cast<float>(line - frame * height),
                               static_cast<float>(position - line * width)};
#pragma unroll
  for (int a = 0; a < 3; ++a) axes[a] = coordinate[a] * grid.scale[a] * 2.0f - 1.0f;
}

// The angle is rounded to fp32 as diffusers computes it (one product, not contracted), so
// it is diffusers' angle, ~1e4 radians at the top. sincosf of it costs a full range
// reduction with a slow-path branch, which dominated the instructions of the video kernels;
// the fast-math __sincosf alone loses all accuracy there. Instead the angle is reduced to
// [-pi, pi] here by 2*pi in three parts (Cody-Waite: 6.28125 has 8 significant bits, so its
// product with a quotient below 2^16 is exact; the fmas round once each) and the hardware
// sin/cos evaluate the rest, whose absolute error on [-pi, pi] is ~2^-21.4: far inside the
// fp32 angle's own uncertainty (~1e-3 rad at 1e4).
__device__ __forceinline__ void video_cos_sin(float frequency, float axis_value, float& c,
                                              float& s) {
  constexpr float kInvTwoPi = 0.159154943091895336f;
  constexpr float kTwoPiHi = 6.28125f;
  constexpr float kTwoPiMid = 1.9353071693331003e-3f;
  constexpr float kTwoPiLo = 1.0253376273028358e-11f;
  const float angle = __fmul_rn(frequency, axis_value);
  const float turns = rintf(angle * kInvTwoPi);
  float reduced = fmaf(-turns, kTwoPiHi, angle);
  reduced = fmaf(-turns, kTwoPiMid, reduced);
  reduced = fmaf(-turns, kTwoPiLo, reduced);
  __sincosf(reduced, &s, &c);
}

// One thread's pairs of a row of LTX-Video angles: pair (step, i) is pair
// (step * THREADS_PER_ROW + lane) * PAIRS_PER_VECTOR + i of the row. Its frequency depends
// only on the column, so it is computed once per thread. Its axis, j % 3 for the j-th pair
// past the padding, is (first_axis + step * THREADS_PER_ROW * PAIRS_PER_VECTOR + i) % 3:
// once a token's axis values are rotated by first_axis (rotate_axes), each pair's is at an
// index known at compile time, which saves a thread the two selects per pair that picking
// it at run time costs. Only the row's pairs 0 and 1 can be padding (dim % 6 elements), so
// only the (step, i) that are those pairs in lane 0 test for it, and set cos 1 and sin 0
// exactly.
template <int STEPS, int PAIRS_PER_VECTOR, int THREADS_PER_ROW>
struct VideoPairs {
  static constexpr int kStepPairs = THREADS_PER_ROW * PAIRS_PER_VECTOR;
  static constexpr int kStepShift = kStepPairs % 3;
  float frequency[STEPS][PAIRS_PER_VECTOR];
  int first_axis;

  // Whether pair (step, i) can be padding: in lane 0 it is the row's pair
  // step * kStepPairs + i, and padding pairs are the row's first pad_pairs <= 2.
  __device__ static constexpr bool may_pad(int step, int i) { return step * kStepPairs + i < 2; }

  __device__ __forceinline__ void init(const RopeVideoGrid& grid, int lane) {
    static_assert(PAIRS_PER_VECTOR <= 4, "a vector's pairs span at most two frequencies");
    // Pair indices past the padding are at least -2 (pad_pairs <= 2), so j + 3 is a valid
    // unsigned dividend, and (j + 3) / 3 - 1 is floor(j / 3) without a signed division.
    const int pair0 = lane * PAIRS_PER_VECTOR - grid.pad_pairs;
    first_axis = static_cast<int>(static_cast<unsigned>(pair0 + 3) % 3u);
#pragma unroll
    for (int step = 0; step < STEPS; ++step) {
      // Pair i of the step is pair j0 + i past the padding (the padding pairs, j < 0, have
      // frequency 0: cos 1, sin 0). Its index, (j0 + i) / 3, is the first pair's or the one
      // after, so two exp2s serve a vector's pairs: pair 0 takes the first, a pair i >= 3 the
      // second, the others the second once phase + i reaches 3.
      const int j0 = pair0 + step * kStepPairs;
      const int base = static_cast<int>(static_cast<unsigned>(j0 + 3) / 3u) - 1;
      const int phase = j0 - 3 * base;  // 0, 1 or 2
      const float low = video_frequency(grid, base);
      const float high = PAIRS_PER_VECTOR > 1 ? video_frequency(grid, base + 1) : low;
#pragma unroll
      for (int i = 0; i < PAIRS_PER_VECTOR; ++i) {
        float frequency_i = i == 0 ? low : i >= 3 ? high : (phase + i >= 3 ? high : low);
        if (may_pad(step, i) && j0 + i < 0) frequency_i = 0.0f;
        frequency[step][i] = frequency_i;
      }
    }
  }

  // The axis values of the token at `position` (video_axes), rotated so that rotated[m] is
  // axis (first_axis + m) % 3's.
  __device__ __forceinline__ void rotate_axes(const RopeVideoGrid& grid, unsigned position,
                                              float* rotated) const {
    float axes[3];
    video_axes(grid, position, axes);
    rotated[0] = first_axis == 0 ? axes[0] : first_axis == 1 ? axes[1] : axes[2];
    rotated[1] = first_axis == 0 ? axes[1] : first_axis == 1 ? axes[2] : axes[0];
    rotated[2] = first_axis == 0 ? axes[2] : first_axis == 1 ? axes[0] : axes[1];
  }

  // cos and sin of pair (step, i) (both known at compile time once unrolled).
  __device__ __forceinline__ void cos_sin(int step, int i, const float* rotated, float& c,
                                          float& s) const {
    video_cos_sin(frequency[step][i], rotated[(step * kStepShift + i) % 3], c, s);
    if (may_pad(step, i) && frequency[step][i] == 0.0f) {
      c = 1.0f;
      s = 0.0f;
    }
  }
};

}  // namespace kiln
