// The activation family's kernel: one elementwise pass over rows x WIDTH, out = OP(a, b, c),
// math in fp32 and rounded once. Used for swiglu (silu(gate) * up), geglu (gelu(gate) * up),
// gelu (gelu(x + bias)) and gated_residual (h + y * gate).
//
// Each input is read once and the output written once, in VEC_BYTES-wide accesses: thread t
// of the grid handles vectors t, t + S, ..., t + (UNROLL - 1) * S (S = the grid's thread
// count), issuing all UNROLL loads of every operand before the first use, then strides on by
// UNROLL * S. Consecutive threads touch consecutive vectors, so every warp access is one
// contiguous span.
//
// Two index spaces:
// - rows (FLAT false): vector v is column (v % (WIDTH / VEC)) of row (v / (WIDTH / VEC)), so
//   every operand may have its own row stride, a row stride of 0 (a broadcast row, e.g. a
//   bias), or one row per sample. WIDTH must be a whole number of vectors (the host narrows
//   the vector otherwise).
// - flat (FLAT true): every operand is rows * WIDTH contiguous elements in the same layout,
//   so the data is one array and vectors run across row ends; any WIDTH gets full-width
//   vectors, and the last rows * WIDTH % VEC elements (fewer than one vector) are done after
//   the main loop, by the first threads of CTA 0, so the main loop has no tail branch.
// WIDTH is a compile-time constant: the row/column split is a multiply by a constant.
//
// An op whose gate and up come interleaved in one packed row (kInterleaved: gate_up[2j] is
// gate j, gate_up[2j + 1] up j) reads, for each output vector, the two input vectors that
// hold its pairs (a at twice the output's column), as the first and second vectors of a.
#pragma once

#include "kiln/common.cuh"
#include "kiln/dependent_launch.cuh"
#include "kiln/elementwise_params.cuh"

namespace kiln {

// ---------------------------------------------------------------------------------------
// The math, in fp32. exp goes through ex2.approx (relative error ~2^-21, well inside fp32's
// tolerance after one rounding); x * sigmoid(z) is written x / (1 + exp(-z)), which is exact
// in both limits (exp overflowing to inf gives -0 or 0, as the true value rounds to).

// F.silu: x * sigmoid(x).
__device__ __forceinline__ float silu(float x) {
  return times_sigmoid(x, x);
}

// F.gelu(approximate='tanh'): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), using
// 0.5 (1 + tanh(u)) = sigmoid(2u), which stays accurate where tanh(u) is near -1.
__device__ __forceinline__ float gelu_tanh(float x) {
  constexpr float kTwoSqrtTwoOverPi = 2.0f * 0.7978845608028654f;
  const float u = kTwoSqrtTwoOverPi * x * fmaf(0.044715f * x, x, 1.0f);
  return times_sigmoid(x, u);
}

// F.gelu(approximate='none'): 0.5 x (1 + erf(x / sqrt(2))).
__device__ __forceinline__ float gelu_erf(float x) {
  return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}

template <bool ERF>
__device__ __forceinline__ float gelu(float x) {
  if constexpr (ERF) {
    return gelu_erf(x);
  } else {
    return gelu_tanh(x);
  }
}

// ---------------------------------------------------------------------------------------
// The ops. kOperands: how many of a, b, c are read. kPerSample: c has one row per
// rows_per_sample rows. kInPlace: out may be a, so a is read with coherent loads (the
// non-coherent path is only valid for memory the kernel never writes). kNeedsRows: an
// operand is indexed by row or column (a broadcast), so the op cannot run flat. kInterleaved:
// gate and up are the pairs of one packed row (a), b is not read. apply() also receives the
// kernel's parameters, for ops with scalars (clamped_swiglu's alpha and limit).

// swiglu: silu(gate) * up.
struct SiluMul {
  static constexpr int kOperands = 2;
  static constexpr bool kPerSample = false;
  static constexpr bool kInPlace = false;
  static constexpr bool kNeedsRows = false;
  static constexpr bool kInterleaved = false;
  __device__ __forceinline__ static float apply(float gate, float up, float,
                                                const ElementwiseParams&) {
    return silu(gate) * up;
  }
};

// geglu: gelu(gate) * up, erf form when ERF, tanh approximation otherwise.
template <bool ERF>
struct GeluMul {
  static constexpr int kOperands = 2;
  static constexpr bool kPerSample = false;
  static constexpr bool kInPlace = false;
  static constexpr bool kNeedsRows = false;
  static constexpr bool kInterleaved = false;
  __device__ __forceinline__ static float apply(float gate, float up, float,
                                                const ElementwiseParams&) {
    return gelu<ERF>(gate) * up;
  }
};

// gelu: gelu(x + bias) with a bias (b, row stride 0) when HAS_BIAS, gelu(x) otherwise.
template <bool ERF, bool HAS_BIAS>
struct BiasGelu {
  static constexpr int kOperands = HAS_BIAS ? 2 : 1;
  static constexpr bool kPerSample = false;
  static constexpr bool kInPlace = false;
  static constexpr bool kNeedsRows = HAS_BIAS;
  static constexpr bool kInterleaved = false;
  __device__ __forceinline__ static float apply(float x, float bias, float,
                                                const ElementwiseParams&) {
    return gelu<ERF>(HAS_BIAS ? x + bias : x);
  }
};

// gated_residual: h + y * gate (one fused multiply-add), the gate per token (c's own row
// stride, 0 for one gate shared by all rows) or per sample (PER_SAMPLE).
template <bool PER_SAMPLE, bool IN_PLACE>
struct GatedResidual {
  static constexpr int kOperands = 3;
  static constexpr bool kPerSample = PER_SAMPLE;
  static constexpr bool kInPlace = IN_PLACE;
  static constexpr bool kNeedsRows = PER_SAMPLE;
  static constexpr bool kInterleaved = false;
  __device__ __forceinline__ static float apply(float h, float y, float gate,
                                                const ElementwiseParams&) {
    return fmaf(y, gate, h);
  }
};

// clamped_swiglu, GPT-OSS's expert gate: with g = min(gate, limit) and u = clamp(up, -limit,
// limit), (u + 1) * g * sigmoid(alpha * g). The clamps are compare-and-select, so a NaN passes
// through as torch.clamp passes it (fminf would return the limit). INTERLEAVED: gate and up are
// the pairs of one packed row (GPT-OSS's gate_up_proj output); otherwise its two halves.
template <bool INTERLEAVED>
struct ClampedSiluMul {
  static constexpr int kOperands = 2;
  static constexpr bool kPerSample = false;
  static constexpr bool kInPlace = false;
  static constexpr bool kNeedsRows = false;
  static constexpr bool kInterleaved = INTERLEAVED;
  __device__ __forceinline__ static float apply(float gate, float up, float,
                                                const ElementwiseParams& p) {
    const float g = gate > p.limit ? p.limit : gate;
    const float u = up < -p.limit ? -p.limit : (up > p.limit ? p.limit : up);
    return (u + 1.0f) * times_sigmoid(g, p.alpha * g);
  }
};

template <bool COHERENT, int BYTES>
__device__ __forceinline__ Raw<BYTES> load_operand(const void* address) {
  if constexpr (COHERENT) {
    return load_global<BYTES>(address);
  } else {
    return load_global_nc<BYTES>(address);
  }
}

// Element j of the two vectors a, b read as one run of 2 * kVec elements (an interleaved
// op's input pairs).
template <typename T, int VEC_BYTES>
__device__ __forceinline__ float pair_element(const Raw<VEC_BYTES>& a, const Raw<VEC_BYTES>& b,
                                              int j) {
  constexpr int kVec = VEC_BYTES / static_cast<int>(sizeof(T));
  return j < kVec ? get_element<T>(a, j) : get_element<T>(b, j - kVec);
}

template <typename T, int VEC_BYTES, typename OP>
__device__ __forceinline__ Raw<VEC_BYTES> apply_vector(const Raw<VEC_BYTES>& a,
                                                       const Raw<VEC_BYTES>& b,
                                                       const Raw<VEC_BYTES>& c,
                                                       const ElementwiseParams& p) {
  Raw<VEC_BYTES> result;
#pragma unroll
  for (int w = 0; w < (VEC_BYTES < 4 ? 1 : VEC_BYTES / 4); ++w) result.words[w] = 0;
#pragma unroll
  for (int i = 0; i < VEC_BYTES / static_cast<int>(sizeof(T)); ++i) {
    float value;
    if constexpr (OP::kInterleaved) {
      value = OP::apply(pair_element<T, VEC_BYTES>(a, b, 2 * i),
                        pair_element<T, VEC_BYTES>(a, b, 2 * i + 1), 0.0f, p);
    } else {
      value = OP::apply(get_element<T>(a, i), OP::kOperands > 1 ? get_element<T>(b, i) : 0.0f,
                        OP::kOperands > 2 ? get_element<T>(c, i) : 0.0f, p);
    }
    set_element<T>(result, i, value);
  }
  return result;
}

// The kernel's work: the grid-stride loop over the vectors, in INDEX arithmetic (see the
// kernel's INDEX64), then a flat array's partial last vector. Element offsets are always
// 64-bit.
template <typename INDEX, typename T, int WIDTH, int VEC_BYTES, int CTA_THREADS, int UNROLL,
          bool FLAT, typename OP>
__device__ __forceinline__ void elementwise_pass(const ElementwiseParams& p) {
  constexpr int kVec = VEC_BYTES / static_cast<int>(sizeof(T));
  constexpr INDEX kVecsPerRow = WIDTH / kVec;
  constexpr bool kCoherent = OP::kInPlace;

  const unsigned long long elements = static_cast<unsigned long long>(p.rows) * WIDTH;
  const auto total = static_cast<INDEX>(
      FLAT ? elements / kVec : static_cast<unsigned long long>(p.rows) * kVecsPerRow);

  const T* const a = static_cast<const T*>(p.a);
  const T* const b = static_cast<const T*>(p.b);
  const T* const c = static_cast<const T*>(p.c);
  T* const out = static_cast<T*>(p.out);
  const INDEX stride = static_cast<INDEX>(gridDim.x) * CTA_THREADS;

  for (INDEX first = static_cast<INDEX>(blockIdx.x) * CTA_THREADS + threadIdx.x; first < total;
       first += stride * UNROLL) {
    Raw<VEC_BYTES> ra[UNROLL];
    Raw<VEC_BYTES> rb[OP::kOperands > 1 ? UNROLL : 1];
    Raw<VEC_BYTES> rc[OP::kOperands > 2 ? UNROLL : 1];
    long long out_offset[UNROLL];
    // Every load of the group is issued before any is used, so they are in flight together.
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
      const INDEX v = first + k * stride;
      if (k == 0 || v < total) {
        long long a_offset, b_offset, c_offset;
        if constexpr (FLAT) {
          a_offset = b_offset = c_offset = out_offset[k] = static_cast<long long>(v) * kVec;
          if constexpr (OP::kInterleaved) a_offset *= 2;
        } else {
          const INDEX row_index = v / kVecsPerRow;
          const long long column = static_cast<long long>(v - row_index * kVecsPerRow) * kVec;
          const auto row = static_cast<long long>(row_index);
          const auto c_row =
              OP::kPerSample ? static_cast<long long>(quotient(row_index, p.rows_per_sample)) : row;
          a_offset = row * p.a_row_stride + (OP::kInterleaved ? 2 * column : column);
          b_offset = row * p.b_row_stride + column;
          c_offset = c_row * p.c_row_stride + column;
          out_offset[k] = row * p.out_row_stride + column;
        }
        ra[k] = load_operand<kCoherent, VEC_BYTES>(a + a_offset);
        if constexpr (OP::kInterleaved) {
          rb[k] = load_operand<kCoherent, VEC_BYTES>(a + a_offset + kVec);
        } else if constexpr (OP::kOperands > 1) {
          rb[k] = load_operand<kCoherent, VEC_BYTES>(b + b_offset);
        }
        if constexpr (OP::kOperands > 2) rc[k] = load_operand<kCoherent, VEC_BYTES>(c + c_offset);
      }
    }
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
      if (k == 0 || first + k * stride < total) {
        const Raw<VEC_BYTES> result = apply_vector<T, VEC_BYTES, OP>(
            ra[k], rb[OP::kOperands > 1 ? k : 0], rc[OP::kOperands > 2 ? k : 0], p);
        store_global<VEC_BYTES>(out + out_offset[k], result);
      }
    }
  }

  // The flat array's last partial vector, element by element.
  if constexpr (FLAT && WIDTH % kVec != 0) {
    const unsigned long long index = static_cast<unsigned long long>(total) * kVec + threadIdx.x;
    if (blockIdx.x == 0 && index < elements) {
      constexpr int kBytes = static_cast<int>(sizeof(T));
      const unsigned long long a_index = OP::kInterleaved ? 2 * index : index;
      const Raw<kBytes> ea = load_operand<kCoherent, kBytes>(a + a_index);
      Raw<kBytes> eb = ea, ec = ea;
      if constexpr (OP::kInterleaved) {
        eb = load_operand<kCoherent, kBytes>(a + a_index + 1);
      } else if constexpr (OP::kOperands > 1) {
        eb = load_operand<kCoherent, kBytes>(b + index);
      }
      if constexpr (OP::kOperands > 2) ec = load_operand<kCoherent, kBytes>(c + index);
      store_global<kBytes>(out + index, apply_vector<T, kBytes, OP>(ea, eb, ec, p));
    }
  }
}

template <bool INDEX64>
struct IndexType {
  using type = unsigned int;
};
template <>
struct IndexType<true> {
  using type = unsigned long long;
};

// INDEX64: the loop's vector indices may pass 2^32 (the host sets it from the call's size and
// checks the launch against it). Otherwise they are 32-bit: the row/column split is then one
// 32-bit multiply-high instead of the four multiplies a 64-bit one takes, and at 1-128 tokens
// that chain sits before each thread's first load. One path per kernel, not a run-time
// choice: a second loop doubles the code, and a launch whose L2 was flushed fetches it cold.
template <typename T, int WIDTH, int VEC_BYTES, int CTA_THREADS, int UNROLL, bool FLAT,
          bool INDEX64, typename OP>
__global__ void __launch_bounds__(CTA_THREADS) elementwise(const ElementwiseParams p) {
  begin_dependent_grid();
  constexpr int kVec = VEC_BYTES / static_cast<int>(sizeof(T));
  static_assert(kVec >= 1 && VEC_BYTES % sizeof(T) == 0, "a vector holds whole elements");
  static_assert(FLAT || WIDTH % kVec == 0, "rows must be made of whole vectors");
  static_assert(!(FLAT && OP::kNeedsRows), "an op with broadcast operands cannot run flat");
  static_assert(UNROLL >= 1, "at least one vector per thread");
  using Index = typename IndexType<INDEX64>::type;
  elementwise_pass<Index, T, WIDTH, VEC_BYTES, CTA_THREADS, UNROLL, FLAT, OP>(p);
}

}  // namespace kiln
