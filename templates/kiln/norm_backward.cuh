// The backward kernel of the normalisation ops (rms_norm, fused_add_rms_norm, layer_norm,
// adaln). For the forward
//
//   xhat = (x - mean) * rstd              (LayerNorm: FEATURES has layer; RMS: mean = 0)
//   n    = xhat [* weight]
//   y    = n [* (1 + scale)] [+ shift | + bias]
//
// and the gradient dy of y, per row and all in fp32:
//
//   dn = dy [* (1 + scale)],  g = dn [* weight]
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))   (mean(g) only for LayerNorm)
//        [+ dr]                                          (fused_add_rms_norm)
//   dscale = dy * n (per token) | summed over a sample's rows (per sample)
//   dweight = sum over rows of dn * xhat,  dbias / dshift = sum over rows of dy
//
// Each gradient other than dx is a feature of its own (NormBackwardParams), so a call
// computes only what its caller asks for: a frozen weight (LoRA) costs no partial sums, and a
// table row's gradient is summed here instead of by a second pass over dscale and dy (up to
// NormBackwardFamily::kMaxHiddenForTableSums wide, where the sums' registers still pay).
//
// The row statistics (mean, rstd) are recomputed from x rather than saved by the forward:
// the forward ops stay as they are, and the backward reads x either way.
//
// Work split as in kiln::norm: a row is shared by THREADS_PER_ROW threads, each owning
// VEC-element vectors strided THREADS_PER_ROW vectors apart, so a thread owns the same
// columns in every row and keeps its share of the parameter gradients in fp32 registers
// across the rows it visits. A group of threads reduces one item (see NormBackwardParams) at
// a time and writes the item's sums to its own partial row: no atomics, and the same sums
// in the same order whatever the launch config. Where nothing is summed across rows, the
// tuner also weighs kiln::norm_backward_rows (norm_backward_rows.cuh), one group a row.
#pragma once

#include "kiln/common.cuh"
#include "kiln/dependent_launch.cuh"
#include "kiln/norm.cuh"
#include "kiln/norm_backward_layout.cuh"
#include "kiln/norm_backward_params.cuh"
#include "kiln/norm_backward_rows.cuh"
#include "kiln/norm_partial_sums.cuh"

namespace kiln {

// Stores VEC fp32 values (a partial row's share of one step) as the widest vectors the
// step's 4 * VEC bytes allow.
template <int VEC>
__device__ __forceinline__ void store_partial(float* destination, const float* values) {
  if constexpr (VEC % 4 == 0) {
#pragma unroll
    for (int i = 0; i < VEC; i += 4) {
      Raw<16> r;
#pragma unroll
      for (int j = 0; j < 4; ++j) r.words[j] = __float_as_uint(values[i + j]);
      store_global<16>(destination + i, r);
    }
  } else if constexpr (VEC == 2) {
    Raw<8> r;
    r.words[0] = __float_as_uint(values[0]);
    r.words[1] = __float_as_uint(values[1]);
    store_global<8>(destination, r);
  } else {
    Raw<4> r;
    r.words[0] = __float_as_uint(values[0]);
    store_global<4>(destination, r);
  }
}

// PREFETCH: a group loads its item's next row while it reduces and writes the current one
// (a second set of the row's registers). An item holds several rows once the row count
// passes the item count (NormBackwardFamily::slots), and without it each of those rows
// waits out a full load before its reductions.
//
// SHARED_SUMS: the parameter sums live in dynamic shared memory instead of registers, each
// thread's own elements lane-interleaved (conflict-free, and no thread reads another's, so no
// barrier guards them). Past 8192 wide a thread's share of the row and two or three sums no
// longer fit its registers (LayerNorm 14848 wide spilled in every config); in shared memory
// the registers hold the row alone, and a prefetched second one fits.
template <typename T, int HIDDEN, int VEC_BYTES, int THREADS_PER_ROW, int CTA_THREADS, unsigned F,
          bool PREFETCH = false, bool SHARED_SUMS = false>
__global__ void __launch_bounds__(CTA_THREADS) norm_backward(const NormBackwardParams p) {
  begin_dependent_grid();
  using Layout = NormBackwardLayout<T, HIDDEN, VEC_BYTES, THREADS_PER_ROW, CTA_THREADS, F>;
  constexpr bool kWeightSum = Layout::kWeight && (F & NormBackwardFeature::weight_sum) != 0;
  constexpr bool kDySum = (F & NormBackwardFeature::dy_sum) != 0;
  constexpr bool kScaleSum = Layout::kModulate && (F & NormBackwardFeature::scale_sum) != 0;
  // A thread's elements of the row, and where each sum's share of them starts.
  constexpr int kHeld = Layout::kSteps * Layout::kVec;
  constexpr int kWeightSlot = 0;
  constexpr int kDySlot = kWeightSum ? 1 : 0;
  constexpr int kScaleSlot = kDySlot + (kDySum ? 1 : 0);
  constexpr int kSums = kScaleSlot + (kScaleSum ? 1 : 0);
  static_assert(!SHARED_SUMS || kSums > 0, "shared sums need a parameter sum");

  const int lane = static_cast<int>(threadIdx.x) % THREADS_PER_ROW;
  const int group = static_cast<int>(threadIdx.x) / THREADS_PER_ROW;
  const long long groups = static_cast<long long>(gridDim.x) * Layout::kRowsPerCta;
  const long long items = p.segments * p.slots;
  // Every thread runs the same iterations (an item's rows are at most this many), because
  // the row reductions may synchronise the whole CTA.
  const long long item_rows = (p.segment_rows + p.slots - 1) / p.slots;
  auto column = [&](int step) { return (step * THREADS_PER_ROW + lane) * Layout::kVec; };
  // Only the last step can run past the row, and only when the split does not divide it.
  auto in_row = [&](int step) {
    return Layout::kExact || step + 1 < Layout::kSteps || column(step) < HIDDEN;
  };
  auto weight_at = [&](int step) {
    return load_global_nc<VEC_BYTES>(static_cast<const T*>(p.weight) + column(step));
  };

  for (long long first = static_cast<long long>(blockIdx.x) * Layout::kRowsPerCta; first < items;
       first += groups) {
    const long long item = first + group;
    const bool item_active = item < items;
    const long long segment = item_active ? item / p.slots : 0;
    const long long slot = item_active ? item - segment * p.slots : 0;

    // In registers, three arrays as before shared sums: one array of all the sums behind an
    // accessor compiled to more spills (layer_norm 14848 wide: 464 bytes a thread, not 208).
    float weight_sum[kWeightSum && !SHARED_SUMS ? kHeld : 1];
    float dy_sum[kDySum && !SHARED_SUMS ? kHeld : 1];
    float scale_sum[kScaleSum && !SHARED_SUMS ? kHeld : 1];
    [[maybe_unused]] float* shared_sums = nullptr;
    if constexpr (SHARED_SUMS) {
      extern __shared__ __align__(16) float norm_backward_shared_sums[];
      shared_sums = norm_backward_shared_sums + group * kSums * kHeld * THREADS_PER_ROW + lane;
    }
    // Element e of a thread's share of the sum in shared-memory slot `slot`.
    [[maybe_unused]] auto shared_sum = [&](int slot, int e) -> float& {
      return shared_sums[(slot * kHeld + e) * THREADS_PER_ROW];
    };
    // Element e of one sum: `registers` (its array) or its shared-memory slot.
    auto sum = [&](float* registers, int slot, int e) -> float& {
      if constexpr (SHARED_SUMS) {
        return shared_sum(slot, e);
      } else {
        return registers[e];
      }
    };
#pragma unroll
    for (int i = 0; i < kHeld; ++i) {
      if constexpr (kWeightSum) sum(weight_sum, kWeightSlot, i) = 0.0f;
      if constexpr (kDySum) sum(dy_sum, kDySlot, i) = 0.0f;
      if constexpr (kScaleSum) sum(scale_sum, kScaleSlot, i) = 0.0f;
    }

    // The row's streams; zeros where there is no row, so they add nothing to the row sums or
    // the parameter sums.
    struct RowStreams {
      Raw<VEC_BYTES> x[Layout::kSteps];
      Raw<VEC_BYTES> dy[Layout::kSteps];
      Raw<VEC_BYTES> dr[Layout::kResidual ? Layout::kSteps : 1];
      Raw<VEC_BYTES> scale[Layout::kModulate ? Layout::kSteps : 1];
    };
    // Row k of the item: whether it exists, and its index among all rows.
    struct RowPlace {
      bool active;
      long long row;
    };
    auto place = [&](long long k) {
      const long long t = slot + k * p.slots;
      return RowPlace{item_active && t < p.segment_rows, segment * p.segment_rows + t};
    };
    // Issues every load of row k of the item before any is used.
    auto load_row = [&](long long k, RowStreams& s) {
      const auto [active, row] = place(k);
      const T* scale_row = nullptr;
      if constexpr (Layout::kModulate) scale_row = norm_backward_scale_row<T>(p, row);
#pragma unroll
      for (int step = 0; step < Layout::kSteps; ++step) {
#pragma unroll
        for (int w = 0; w < Layout::kWords; ++w) {
          s.x[step].words[w] = 0u;
          s.dy[step].words[w] = 0u;
          if constexpr (Layout::kResidual) s.dr[step].words[w] = 0u;
          if constexpr (Layout::kModulate) s.scale[step].words[w] = 0u;
        }
        if (!active || !in_row(step)) continue;
        const int col = column(step);
        s.x[step] =
            load_global_nc<VEC_BYTES>(static_cast<const T*>(p.x) + row * p.x_row_stride + col);
        s.dy[step] =
            load_global_nc<VEC_BYTES>(static_cast<const T*>(p.dy) + row * p.dy_row_stride + col);
        if constexpr (Layout::kResidual) {
          s.dr[step] =
              load_global_nc<VEC_BYTES>(static_cast<const T*>(p.dr) + row * p.dr_row_stride + col);
        }
        if constexpr (Layout::kModulate) s.scale[step] = load_global_nc<VEC_BYTES>(scale_row + col);
      }
    };

    RowStreams next;
    if constexpr (PREFETCH) load_row(0, next);
    for (long long k = 0; k < item_rows; ++k) {
      const auto [active, row] = place(k);
      RowStreams streams;
      if constexpr (PREFETCH) {
        streams = next;
        if (k + 1 < item_rows) load_row(k + 1, next);
      } else {
        load_row(k, streams);
      }
      const Raw<VEC_BYTES>* const x = streams.x;
      const Raw<VEC_BYTES>* const dy = streams.dy;
      [[maybe_unused]] const Raw<VEC_BYTES>* const dr = streams.dr;
      [[maybe_unused]] const Raw<VEC_BYTES>* const scale = streams.scale;

      float mean = 0.0f;
      if constexpr (Layout::kLayer) {
        float sum = 0.0f;
#pragma unroll
        for (int step = 0; step < Layout::kSteps; ++step) {
          float partial = 0.0f;
#pragma unroll
          for (int i = 0; i < Layout::kVec; ++i) partial += get_element<T>(x[step], i);
          sum += partial;
        }
        mean = group_sum<THREADS_PER_ROW, CTA_THREADS>(sum) * Layout::kInvHidden;
      }
      // Elements past the row are zero, but after centring they would count mean^2.
      float squares = 0.0f;
#pragma unroll
      for (int step = 0; step < Layout::kSteps; ++step) {
        float partial = 0.0f;
#pragma unroll
        for (int i = 0; i < Layout::kVec; ++i) {
          const float centred = get_element<T>(x[step], i) - mean;
          partial += centred * centred;
        }
        if (!Layout::kLayer || in_row(step)) squares += partial;
      }
      squares = group_sum<THREADS_PER_ROW, CTA_THREADS>(squares);
      const float rstd = rsqrtf(squares * Layout::kInvHidden + p.eps);

      // First pass: the row sums dx needs, the parameter sums, and dscale per token.
      float g_sum = 0.0f;
      float gx_sum = 0.0f;
#pragma unroll
      for (int step = 0; step < Layout::kSteps; ++step) {
        const bool present = active && in_row(step);
        Raw<VEC_BYTES> weight;
        Raw<VEC_BYTES> table;
        if constexpr (Layout::kWeight) {
          if (present) weight = weight_at(step);
        }
        if constexpr (Layout::kTable) {
          if (present) {
            table = load_global_nc<VEC_BYTES>(static_cast<const T*>(p.table_scale) + column(step));
          }
        }
        float dscale[Layout::kScalePerToken ? Layout::kVec : 1];
#pragma unroll
        for (int i = 0; i < Layout::kVec; ++i) {
          const float xhat = (get_element<T>(x[step], i) - mean) * rstd;
          const float d = get_element<T>(dy[step], i);
          const float w = Layout::kWeight && present ? get_element<T>(weight, i) : 1.0f;
          float dn = d;
          if constexpr (Layout::kModulate) {
            float s = get_element<T>(scale[step], i);
            if constexpr (Layout::kTable) s += present ? get_element<T>(table, i) : 0.0f;
            const float n = xhat * w;
            if constexpr (Layout::kScalePerToken) dscale[i] = d * n;
            if constexpr (kScaleSum) sum(scale_sum, kScaleSlot, step * Layout::kVec + i) += d * n;
            dn = d * (1.0f + s);
          }
          const float g = dn * w;
          if constexpr (kWeightSum)
            sum(weight_sum, kWeightSlot, step * Layout::kVec + i) += dn * xhat;
          if constexpr (kDySum) sum(dy_sum, kDySlot, step * Layout::kVec + i) += d;
          g_sum += g;
          gx_sum += g * xhat;
        }
        if constexpr (Layout::kScalePerToken) {
          if (present) {
            store_floats<T, VEC_BYTES>(static_cast<T*>(p.dscale) + row * HIDDEN + column(step),
                                       dscale);
          }
        }
      }
      gx_sum = group_sum<THREADS_PER_ROW, CTA_THREADS>(gx_sum) * Layout::kInvHidden;
      if constexpr (Layout::kLayer)
        g_sum = group_sum<THREADS_PER_ROW, CTA_THREADS>(g_sum) * Layout::kInvHidden;
      if (!active) continue;

      // Second pass: dx, from the row still in registers (the per-column operands come
      // again from L1).
      T* const dx_row = static_cast<T*>(p.dx) + row * HIDDEN;
#pragma unroll
      for (int step = 0; step < Layout::kSteps; ++step) {
        if (!in_row(step)) continue;
        Raw<VEC_BYTES> weight;
        Raw<VEC_BYTES> table;
        if constexpr (Layout::kWeight) weight = weight_at(step);
        if constexpr (Layout::kTable) {
          table = load_global_nc<VEC_BYTES>(static_cast<const T*>(p.table_scale) + column(step));
        }
        float result[Layout::kVec];
#pragma unroll
        for (int i = 0; i < Layout::kVec; ++i) {
          const float xhat = (get_element<T>(x[step], i) - mean) * rstd;
          float g = get_element<T>(dy[step], i);
          if constexpr (Layout::kModulate) {
            float s = get_element<T>(scale[step], i);
            if constexpr (Layout::kTable) s += get_element<T>(table, i);
            g *= 1.0f + s;
          }
          if constexpr (Layout::kWeight) g *= get_element<T>(weight, i);
          float value = rstd * (g - (Layout::kLayer ? g_sum : 0.0f) - xhat * gx_sum);
          if constexpr (Layout::kResidual) value += get_element<T>(dr[step], i);
          result[i] = value;
        }
        store_floats<T, VEC_BYTES>(dx_row + column(step), result);
      }
    }

    if (!item_active) continue;
    // A step's share of one sum, stored from its registers or gathered from shared memory.
    auto store_sums = [&](const float* registers, int slot, float* partial, int step) {
      const long long offset = item * HIDDEN + column(step);
      if constexpr (SHARED_SUMS) {
        float values[Layout::kVec];
#pragma unroll
        for (int i = 0; i < Layout::kVec; ++i)
          values[i] = shared_sum(slot, step * Layout::kVec + i);
        store_partial<Layout::kVec>(partial + offset, values);
      } else {
        store_partial<Layout::kVec>(partial + offset, registers + step * Layout::kVec);
      }
    };
#pragma unroll
    for (int step = 0; step < Layout::kSteps; ++step) {
      if (!in_row(step)) continue;
      if constexpr (kWeightSum) store_sums(weight_sum, kWeightSlot, p.weight_partial, step);
      if constexpr (kDySum) store_sums(dy_sum, kDySlot, p.dy_partial, step);
      if constexpr (kScaleSum) store_sums(scale_sum, kScaleSlot, p.scale_partial, step);
    }
  }
}

}  // namespace kiln
