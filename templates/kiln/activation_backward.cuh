// The activation ops' backward kernels, math in fp32, each output rounded once:
//   swiglu  y = silu(g) * u:  dg = dy * u * s * (1 + g * (1 - s)), du = dy * silu(g)  (s =
//   sigmoid(g)) geglu   y = gelu(g) * u:  dg = dy * u * gelu'(g),              du = dy * gelu(g)
//   gelu    y = gelu(x + b):  dx = dy * gelu'(x + b),              db = sum over rows of dx
//   clamped_swiglu  y = (u' + 1) * g' * sigmoid(alpha g')  (g' = min(g, limit), u' = u clamped
//   to +-limit): dg = dy * (u' + 1) * s * (1 + alpha g' (1 - s)) where g <= limit, else 0;
//   du = dy * g' * s where |u| <= limit, else 0  (s = sigmoid(alpha g'); torch.clamp's
//   gradient passes at the limits themselves)
// with gelu' of the tanh form s2 + x * s2 * (1 - s2) * d(2v)/dx (s2 = sigmoid(2v), v the tanh
// argument, the forward's own sigmoid form) and of the erf form Phi(x) + x * phi(x).
//
// activation_backward: one pass reading a (gate or x), b (up) and dy, writing one or two
// outputs, with kiln::elementwise's index spaces (rows, or one flat array when every operand
// is rows of exactly WIDTH elements back to back) and its grid-stride, UNROLL-deep loop.
//
// bias_gelu_backward: gelu with a bias, whose gradient is a sum over rows. Each thread owns a
// vector of columns of one CTA-wide column tile (blockIdx.x) and walks the rows of its row
// group (blockIdx.y: rows y, y + G, y + 2G, ... for G = gridDim.y), UNROLL rows in flight,
// keeping its columns' fp32 sums of dx in registers; at the end each row group writes its
// sums as one fp32 row of `partials`, which the host sums over groups. No atomics: the
// result is deterministic, and every config of a problem adds the same values in the same
// order (a column's rows are always visited in row order within the group).
#pragma once

#include "kiln/activation_backward_params.cuh"
#include "kiln/common.cuh"
#include "kiln/dependent_launch.cuh"

namespace kiln {

__device__ __forceinline__ float sigmoid(float z) {
  return __fdividef(1.0f, 1.0f + __expf(-z));
}

// gelu(x) and its derivative, sharing the exp (tanh form) or the erf (erf form).
template <bool ERF>
__device__ __forceinline__ void gelu_with_grad(float x, float& value, float& grad) {
  if constexpr (ERF) {
    constexpr float kRsqrt2 = 0.7071067811865476f;
    constexpr float kRsqrt2Pi = 0.3989422804014327f;
    // erfc keeps Phi's relative accuracy in the far negative tail, where 1 + erf cancels.
    const float cdf = 0.5f * erfcf(-x * kRsqrt2);
    value = x * cdf;
    grad = fmaf(x * kRsqrt2Pi, __expf(-0.5f * x * x), cdf);
  } else {
    constexpr float kTwoSqrtTwoOverPi = 2.0f * 0.7978845608028654f;
    constexpr float kCubic = 0.044715f;
    const float two_v = kTwoSqrtTwoOverPi * x * fmaf(kCubic * x, x, 1.0f);
    const float d_two_v = kTwoSqrtTwoOverPi * fmaf(3.0f * kCubic * x, x, 1.0f);
    const float s = sigmoid(two_v);
    value = x * s;
    grad = fmaf(x * s * (1.0f - s), d_two_v, s);
  }
}

// ---------------------------------------------------------------------------------------
// The ops of activation_backward. kGated: b is read and out1 written. kInterleaved: gate and up
// are the pairs of one packed row, read as two vectors of a at twice the output's column, and
// their gradients written the same way into out0 (b and out1 unused).

struct SiluMulBackward {
  static constexpr bool kGated = true;
  static constexpr bool kInterleaved = false;
  __device__ __forceinline__ static void apply(float gate, float up, float dy, float& dgate,
                                               float& dup, const ActivationBackwardParams&) {
    const float s = sigmoid(gate);
    dup = dy * gate * s;
    dgate = dy * up * s * fmaf(gate, 1.0f - s, 1.0f);
  }
};

template <bool ERF>
struct GeluMulBackward {
  static constexpr bool kGated = true;
  static constexpr bool kInterleaved = false;
  __device__ __forceinline__ static void apply(float gate, float up, float dy, float& dgate,
                                               float& dup, const ActivationBackwardParams&) {
    float value, grad;
    gelu_with_grad<ERF>(gate, value, grad);
    dup = dy * value;
    dgate = dy * up * grad;
  }
};

template <bool ERF>
struct GeluBackward {
  static constexpr bool kGated = false;
  static constexpr bool kInterleaved = false;
  __device__ __forceinline__ static void apply(float x, float, float dy, float& dx, float&,
                                               const ActivationBackwardParams&) {
    float value, grad;
    gelu_with_grad<ERF>(x, value, grad);
    dx = dy * grad;
  }
};

template <bool INTERLEAVED>
struct ClampedSiluMulBackward {
  static constexpr bool kGated = true;
  static constexpr bool kInterleaved = INTERLEAVED;
  __device__ __forceinline__ static void apply(float gate, float up, float dy, float& dgate,
                                               float& dup, const ActivationBackwardParams& p) {
    const float g = gate > p.limit ? p.limit : gate;
    const bool up_inside = up >= -p.limit && up <= p.limit;
    const float u = up_inside ? up : (up < -p.limit ? -p.limit : p.limit);
    const float s = sigmoid(p.alpha * g);
    dup = up_inside ? dy * g * s : 0.0f;
    dgate = gate <= p.limit ? dy * (u + 1.0f) * s * fmaf(p.alpha * g, 1.0f - s, 1.0f) : 0.0f;
  }
};

// Element j of the two vectors a, b read as one run of 2 * kVec elements, and its setter.
template <typename T, int VEC_BYTES>
__device__ __forceinline__ float pair_element(const Raw<VEC_BYTES>& a, const Raw<VEC_BYTES>& b,
                                              int j) {
  constexpr int kVec = VEC_BYTES / static_cast<int>(sizeof(T));
  return j < kVec ? get_element<T>(a, j) : get_element<T>(b, j - kVec);
}
template <typename T, int VEC_BYTES>
__device__ __forceinline__ void set_pair_element(Raw<VEC_BYTES>& a, Raw<VEC_BYTES>& b, int j,
                                                 float value) {
  constexpr int kVec = VEC_BYTES / static_cast<int>(sizeof(T));
  if (j < kVec) {
    set_element<T>(a, j, value);
  } else {
    set_element<T>(b, j - kVec, value);
  }
}

// An interleaved op: a, b are the two input vectors of pairs, out0, out1 the two vectors of
// their gradients in the same order.
template <typename T, int VEC_BYTES, typename OP>
__device__ __forceinline__ void backward_vector(const Raw<VEC_BYTES>& a, const Raw<VEC_BYTES>& b,
                                                const Raw<VEC_BYTES>& dy, Raw<VEC_BYTES>& out0,
                                                Raw<VEC_BYTES>& out1,
                                                const ActivationBackwardParams& p) {
#pragma unroll
  for (int w = 0; w < (VEC_BYTES < 4 ? 1 : VEC_BYTES / 4); ++w) out0.words[w] = out1.words[w] = 0;
#pragma unroll
  for (int i = 0; i < VEC_BYTES / static_cast<int>(sizeof(T)); ++i) {
    float first = 0.0f, second = 0.0f;
    if constexpr (OP::kInterleaved) {
      OP::apply(pair_element<T, VEC_BYTES>(a, b, 2 * i),
                pair_element<T, VEC_BYTES>(a, b, 2 * i + 1), get_element<T>(dy, i), first, second,
                p);
      set_pair_element<T, VEC_BYTES>(out0, out1, 2 * i, first);
      set_pair_element<T, VEC_BYTES>(out0, out1, 2 * i + 1, second);
    } else {
      OP::apply(get_element<T>(a, i), OP::kGated ? get_element<T>(b, i) : 0.0f,
                get_element<T>(dy, i), first, second, p);
      set_element<T>(out0, i, first);
      if constexpr (OP::kGated) set_element<T>(out1, i, second);
    }
  }
}

template <typename T, int WIDTH, int VEC_BYTES, int CTA_THREADS, int UNROLL, bool FLAT, typename OP>
__global__ void __launch_bounds__(CTA_THREADS)
    activation_backward(const ActivationBackwardParams p) {
  begin_dependent_grid();
  constexpr int kVec = VEC_BYTES / static_cast<int>(sizeof(T));
  constexpr unsigned long long kVecsPerRow = WIDTH / kVec;
  static_assert(kVec >= 1 && VEC_BYTES % sizeof(T) == 0, "a vector holds whole elements");
  static_assert(FLAT || WIDTH % kVec == 0, "rows must be made of whole vectors");
  static_assert(UNROLL >= 1, "at least one vector per thread");

  const T* const a = static_cast<const T*>(p.a);
  const T* const b = static_cast<const T*>(p.b);
  const T* const dy = static_cast<const T*>(p.dy);
  T* const out0 = static_cast<T*>(p.out0);
  T* const out1 = static_cast<T*>(p.out1);

  const unsigned long long elements = static_cast<unsigned long long>(p.rows) * WIDTH;
  const unsigned long long total =
      FLAT ? elements / kVec : static_cast<unsigned long long>(p.rows) * kVecsPerRow;
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * CTA_THREADS;

  for (unsigned long long first =
           static_cast<unsigned long long>(blockIdx.x) * CTA_THREADS + threadIdx.x;
       first < total; first += stride * UNROLL) {
    Raw<VEC_BYTES> ra[UNROLL];
    Raw<VEC_BYTES> rb[OP::kGated ? UNROLL : 1];
    Raw<VEC_BYTES> rdy[UNROLL];
    long long out0_offset[UNROLL];
    long long out1_offset[OP::kGated ? UNROLL : 1];
    // Every load of the group is issued before any is used, so they are in flight together.
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
      const unsigned long long v = first + k * stride;
      if (k == 0 || v < total) {
        long long a_offset, b_offset, dy_offset, o1_offset;
        if constexpr (FLAT) {
          a_offset = b_offset = dy_offset = o1_offset = out0_offset[k] =
              static_cast<long long>(v) * kVec;
          if constexpr (OP::kInterleaved) {
            a_offset *= 2;
            out0_offset[k] *= 2;
          }
        } else {
          const long long row = static_cast<long long>(v / kVecsPerRow);
          const long long column = static_cast<long long>(v - row * kVecsPerRow) * kVec;
          const long long packed_column = OP::kInterleaved ? 2 * column : column;
          a_offset = row * p.a_row_stride + packed_column;
          b_offset = row * p.b_row_stride + column;
          dy_offset = row * p.dy_row_stride + column;
          out0_offset[k] = row * p.out0_row_stride + packed_column;
          o1_offset = row * p.out1_row_stride + column;
        }
        if constexpr (OP::kInterleaved) {  // the pairs' second vector, in and out
          b_offset = a_offset + kVec;
          o1_offset = out0_offset[k] + kVec;
        }
        ra[k] = load_global_nc<VEC_BYTES>(a + a_offset);
        rdy[k] = load_global_nc<VEC_BYTES>(dy + dy_offset);
        if constexpr (OP::kGated) {
          rb[k] = load_global_nc<VEC_BYTES>((OP::kInterleaved ? a : b) + b_offset);
          out1_offset[k] = o1_offset;
        }
      }
    }
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
      if (k == 0 || first + k * stride < total) {
        Raw<VEC_BYTES> r0, r1;
        backward_vector<T, VEC_BYTES, OP>(ra[k], rb[OP::kGated ? k : 0], rdy[k], r0, r1, p);
        store_global<VEC_BYTES>(out0 + out0_offset[k], r0);
        if constexpr (OP::kGated)
          store_global<VEC_BYTES>((OP::kInterleaved ? out0 : out1) + out1_offset[k], r1);
      }
    }
  }

  // The flat array's last partial vector, element by element.
  if constexpr (FLAT && WIDTH % kVec != 0) {
    const unsigned long long index = total * kVec + threadIdx.x;
    if (blockIdx.x == 0 && index < elements) {
      constexpr int kBytes = static_cast<int>(sizeof(T));
      const unsigned long long packed = OP::kInterleaved ? 2 * index : index;
      const Raw<kBytes> ea = load_global_nc<kBytes>(a + packed);
      const Raw<kBytes> edy = load_global_nc<kBytes>(dy + index);
      Raw<kBytes> eb = ea;
      if constexpr (OP::kInterleaved) {
        eb = load_global_nc<kBytes>(a + packed + 1);
      } else if constexpr (OP::kGated) {
        eb = load_global_nc<kBytes>(b + index);
      }
      Raw<kBytes> r0, r1;
      backward_vector<T, kBytes, OP>(ea, eb, edy, r0, r1, p);
      store_global<kBytes>(out0 + packed, r0);
      if constexpr (OP::kInterleaved) {
        store_global<kBytes>(out0 + packed + 1, r1);
      } else if constexpr (OP::kGated) {
        store_global<kBytes>(out1 + index, r1);
      }
    }
  }
}

template <typename T, int WIDTH, int VEC_BYTES, int CTA_THREADS, int UNROLL, bool ERF>
__global__ void __launch_bounds__(CTA_THREADS)
    bias_gelu_backward(const ActivationBackwardParams p) {
  begin_dependent_grid();
  constexpr int kVec = VEC_BYTES / static_cast<int>(sizeof(T));
  constexpr int kVecsPerRow = WIDTH / kVec;
  // fp32 sums leave in pieces of at most 16 bytes, aligned since WIDTH is whole vectors.
  constexpr int kSumBytes = kVec * 4 < 16 ? kVec * 4 : 16;
  constexpr int kSumPieces = kVec * 4 / kSumBytes;
  static_assert(kVec >= 1 && VEC_BYTES % sizeof(T) == 0, "a vector holds whole elements");
  static_assert(WIDTH % kVec == 0, "rows must be made of whole vectors");
  static_assert(UNROLL >= 1, "at least one row per thread");

  const int vector = static_cast<int>(blockIdx.x) * CTA_THREADS + static_cast<int>(threadIdx.x);
  if (vector >= kVecsPerRow) return;
  const long long column = static_cast<long long>(vector) * kVec;
  const long long groups = gridDim.y;
  const T* const x = static_cast<const T*>(p.a);
  const T* const dy = static_cast<const T*>(p.dy);
  T* const dx = static_cast<T*>(p.out0);

  float bias[kVec];
  load_floats_nc<T, VEC_BYTES>(static_cast<const T*>(p.b) + column, bias);
  float sum[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) sum[i] = 0.0f;

  for (long long first = blockIdx.y; first < p.rows; first += groups * UNROLL) {
    Raw<VEC_BYTES> rx[UNROLL];
    Raw<VEC_BYTES> rdy[UNROLL];
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
      const long long row = first + k * groups;
      if (k == 0 || row < p.rows) {
        rx[k] = load_global_nc<VEC_BYTES>(x + row * p.a_row_stride + column);
        rdy[k] = load_global_nc<VEC_BYTES>(dy + row * p.dy_row_stride + column);
      }
    }
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
      const long long row = first + k * groups;
      if (k == 0 || row < p.rows) {
        float grad[kVec];
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          float value, derivative;
          gelu_with_grad<ERF>(get_element<T>(rx[k], i) + bias[i], value, derivative);
          grad[i] = get_element<T>(rdy[k], i) * derivative;
          sum[i] += grad[i];
        }
        store_floats<T, VEC_BYTES>(dx + row * p.out0_row_stride + column, grad);
      }
    }
  }

  float* const partial = p.partials + static_cast<long long>(blockIdx.y) * WIDTH + column;
#pragma unroll
  for (int piece = 0; piece < kSumPieces; ++piece) {
    store_floats<float, kSumBytes>(partial + piece * (kSumBytes / 4),
                                   sum + piece * (kSumBytes / 4));
  }
}

}  // namespace kiln
