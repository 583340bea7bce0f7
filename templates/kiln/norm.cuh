// The normalisation kernel behind the norm ops (rms_norm, fused_add_rms_norm, layer_norm, adaln,
// gated_adaln and rms_norm_gated):
//
//   s   = x                      (plain norms)
//       | T(x + residual)        (fused_add_rms_norm; stored to sum_out)
//       | T(x + y * gate)        (gated_adaln; stored to sum_out)
//   n   = (s - mean(s)) * rsqrt(var(s) + eps)     (LayerNorm: FEATURES has layer)
//       | s * rsqrt(mean(s^2) + eps)              (RMSNorm)
//   out = T(((n * weight) + bias) * (1 + scale) + shift)   (each factor where present)
//       | T(n * weight * silu(z))  or  T(n * weight * sigmoid(z))   (rms_norm_gated)
// where rms_norm_gated with z_first normalises s = T(x * silu(z)) (or sigmoid) instead and
// does not gate the output (Mamba-2's form).
//
// gate, scale and shift each add their table row where FEATURES has table; the rows are of T,
// or fp32 with table_f32.
//
// all math in fp32. The sum is rounded to T before it is normalised, so out is exactly the
// norm of the stored residual stream, as the eager composition computes it.
//
// Work split as in kiln::rms_norm: a row is shared by THREADS_PER_ROW threads, each owning
// VEC-element vectors strided THREADS_PER_ROW vectors apart, held in registers between the
// reduction and the output, as T (half the registers of floats for 16-bit types). Per-
// column operands (weight, bias, table rows) and per-sample modulation rows are read where
// they are used, from L1 (kiln/stream_access.cuh says why the row streams do not skip it).
// With PREFETCH, the loads of a thread's next
// row are issued before the current row is reduced, so memory stays busy through the reduction and
// the stores. With REREAD the row is not held at all but read twice (NormRow::process_reread).
// kiln::norm_staged holds it in shared memory instead, copied there with cp.async
// (NormRow::stage_row and normalise_staged). kiln::norm_cluster splits each row over the
// CTAs of a thread-block cluster (sm_90).
#pragma once

#include "kiln/async_copy.cuh"
#include "kiln/cluster.cuh"
#include "kiln/common.cuh"
#include "kiln/dependent_launch.cuh"
#include "kiln/norm_params.cuh"
#include "kiln/stream_access.cuh"

namespace kiln {

template <int VEC_BYTES, int STEPS, bool PRESENT>
struct RawVectors {
  Raw<VEC_BYTES> v[PRESENT ? STEPS : 1];
};

// A vector of a table row: as loaded where its elements are T (TABLE_F32 false), else
// kVec floats, loaded 16 bytes at a time (or the whole vector where that is narrower).
template <typename T, int VEC_BYTES, bool TABLE_F32>
struct TableVector {
  using Element = T;
  static constexpr int kVec = VEC_BYTES / static_cast<int>(sizeof(T));
  Raw<VEC_BYTES> raw;

  __device__ __forceinline__ static TableVector load(const void* base, int col) {
    return {load_global_nc<VEC_BYTES>(static_cast<const T*>(base) + col)};
  }
  __device__ __forceinline__ float operator[](int i) const { return get_element<T>(raw, i); }
};

template <typename T, int VEC_BYTES>
struct TableVector<T, VEC_BYTES, true> {
  using Element = float;
  static constexpr int kVec = VEC_BYTES / static_cast<int>(sizeof(T));
  static constexpr int kChunk = kVec * 4 < 16 ? kVec * 4 : 16;
  static constexpr int kPerChunk = kChunk / 4;
  float v[kVec];

  __device__ __forceinline__ static TableVector load(const void* base, int col) {
    TableVector t;
    const float* source = static_cast<const float*>(base) + col;
#pragma unroll
    for (int chunk = 0; chunk < kVec / kPerChunk; ++chunk) {
      const Raw<kChunk> r = load_global_nc<kChunk>(source + chunk * kPerChunk);
#pragma unroll
      for (int i = 0; i < kPerChunk; ++i) t.v[chunk * kPerChunk + i] = __uint_as_float(r.words[i]);
    }
    return t;
  }
  __device__ __forceinline__ float operator[](int i) const {
    return v[i];
  }
};

// The row-dependent inputs of one row, as loaded (raw, so 16-bit data takes half the
// registers of floats).
template <int VEC_BYTES, int STEPS, unsigned F>
struct NormRowInputs {
  static constexpr bool kStreamed = (F & NormFeature::per_sample) == 0;
  RawVectors<VEC_BYTES, STEPS, true> x;
  // the residual, y, or rms_norm_gated's z
  RawVectors<VEC_BYTES, STEPS, (F & NormFeature::second_row) != 0> second;
  RawVectors<VEC_BYTES, STEPS, kStreamed && (F & NormFeature::gate) != 0> gate;
  RawVectors<VEC_BYTES, STEPS, kStreamed && (F & NormFeature::modulate) != 0> scale;
  RawVectors<VEC_BYTES, STEPS, kStreamed && (F & NormFeature::modulate) != 0> shift;
};

// Inputs the kernel also writes (in place) are read through the coherent path.
template <int VEC_BYTES, bool COHERENT>
__device__ __forceinline__ Raw<VEC_BYTES> load_input(const void* address) {
  if constexpr (COHERENT) {
    return load_global<VEC_BYTES>(address);
  } else {
    return load_global_nc<VEC_BYTES>(address);
  }
}

template <typename T>
__device__ __forceinline__ const T* modulation_row(const NormModulation& m, long long batch,
                                                   long long token) {
  return static_cast<const T*>(m.data) + batch * m.batch_stride + token * m.token_stride;
}

// A row is shared by THREADS_PER_ROW threads of each of ROW_CTAS CTAs (more than one only
// in kiln::norm_cluster): `lane` counts over all of them.
template <typename T, int HIDDEN, int VEC_BYTES, int THREADS_PER_ROW, unsigned F, int ROW_CTAS = 1>
struct NormRow {
  static constexpr int kVec = VEC_BYTES / static_cast<int>(sizeof(T));
  static constexpr int kRowThreads = THREADS_PER_ROW * ROW_CTAS;
  static constexpr int kStride = kVec * kRowThreads;
  static constexpr int kSteps = (HIDDEN + kStride - 1) / kStride;
  static constexpr bool kExact = HIDDEN % kStride == 0;
  static constexpr bool kInPlace = (F & NormFeature::in_place) != 0;
  static constexpr bool kSum = (F & (NormFeature::residual | NormFeature::gate)) != 0;
  // rms_norm_gated's z is held with the row from its load to the output, as per-token
  // modulation rows are (its kernel has neither a re-read nor a staged form), or with z_first
  // gates x as it is loaded.
  static constexpr bool kZGate = (F & NormFeature::z_gate) != 0;
  static constexpr bool kZFirst = kZGate && (F & NormFeature::z_first) != 0;
  static constexpr bool kTable = (F & NormFeature::table) != 0;
  static constexpr bool kTableF32 = kTable && (F & NormFeature::table_f32) != 0;
  using TableVec = TableVector<T, VEC_BYTES, kTableF32>;
  using TableT = typename TableVec::Element;
  static constexpr bool kPerSample = (F & NormFeature::per_sample) != 0;
  // Per-token scale and shift rows are streams of the row; per-sample ones come with the
  // per-column operands (Columns).
  static constexpr bool kStreamedModulation = (F & NormFeature::modulate) != 0 && !kPerSample;
  using RowInputs = NormRowInputs<VEC_BYTES, kSteps, F>;
  using Params = NormArgs<F>;

  __device__ __forceinline__ static int column(int step, int lane) {
    return (step * kRowThreads + lane) * kVec;
  }

  // The sum over the row's threads. Calls alternate `parity` (a cluster's buffers; see
  // cluster_sum), and every thread of the CTA (of the cluster) makes them.
  template <int CTA_THREADS>
  __device__ __forceinline__ static float row_sum(float value, int parity) {
    if constexpr (ROW_CTAS == 1) {
      return group_sum<THREADS_PER_ROW, CTA_THREADS>(value);
    } else {
      static_assert(THREADS_PER_ROW == CTA_THREADS, "a clustered CTA holds a slice of one row");
      return cluster_sum<CTA_THREADS, ROW_CTAS>(value, parity);
    }
  }
  // The sample a row belongs to: row / tokens, as a multiply-high (see kiln/divisor.cuh).
  __device__ __forceinline__ static long long sample_index(const Params& p, long long row) {
    return static_cast<long long>(quotient(static_cast<unsigned long long>(row), p.tokens_divisor));
  }
  // Only the last step can run past the row, and only when the split does not divide it.
  __device__ __forceinline__ static bool in_row(int step, int lane) {
    return kExact || step + 1 < kSteps || column(step, lane) < HIDDEN;
  }
  // A per-column operand: the same for every row, so it stays in L1.
  __device__ __forceinline__ static Raw<VEC_BYTES> column_operand(const void* base, int col) {
    return load_global_nc<VEC_BYTES>(static_cast<const T*>(base) + col);
  }

  // All loads of the row are issued before any is used, so they are in flight together.
  __device__ __forceinline__ static void load_row(const Params& p, long long row, int lane,
                                                  RowInputs& in) {
    const T* const x_row = static_cast<const T*>(p.x) + row * p.x_row_stride;
    const T* second_row = nullptr;  // the residual, y, or z
    if constexpr ((F & NormFeature::second_row) != 0) {
      second_row = static_cast<const T*>(p.second) + row * p.second_row_stride;
    }
    long long batch = 0;
    long long token = 0;
    if constexpr (!kPerSample && (F & (NormFeature::gate | NormFeature::modulate)) != 0) {
      batch = sample_index(p, row);
      token = row - batch * p.tokens;
    }
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      if (!in_row(step, lane)) continue;
      const int col = column(step, lane);
      in.x.v[step] = load_input<VEC_BYTES, kInPlace>(x_row + col);
      if constexpr (kZGate) in.second.v[step] = load_global_nc<VEC_BYTES>(second_row + col);
      if constexpr ((F & NormFeature::residual) != 0) {
        in.second.v[step] = load_input<VEC_BYTES, kInPlace>(second_row + col);
      } else if constexpr ((F & NormFeature::gate) != 0) {
        in.second.v[step] = load_global_nc<VEC_BYTES>(second_row + col);
        if constexpr (!kPerSample) {
          in.gate.v[step] =
              load_global_nc<VEC_BYTES>(modulation_row<T>(p.gate, batch, token) + col);
        }
      }
      if constexpr (kStreamedModulation) {
        in.scale.v[step] =
            load_global_nc<VEC_BYTES>(modulation_row<T>(p.scale, batch, token) + col);
        in.shift.v[step] =
            load_global_nc<VEC_BYTES>(modulation_row<T>(p.shift, batch, token) + col);
      }
    }
  }

  // The per-column operands of one step, and per-sample modulation rows, which every row of
  // a sample reads again just as every row reads the per-column ones.
  struct Columns {
    Raw<VEC_BYTES> weight, bias, gate, scale, shift;
    TableVec table_gate, table_scale, table_shift;
  };
  static constexpr int kSampleStreams = kPerSample ? ((F & NormFeature::gate) != 0 ? 3 : 0) +
                                                         ((F & NormFeature::modulate) != 0 ? 2 : 0)
                                                   : 0;
  // (an fp32 table row counts for as many streams as its vectors take T-vectors' registers)
  static constexpr int kColumnStreams =
      ((F & NormFeature::weight) != 0 ? 1 : 0) + ((F & NormFeature::bias) != 0 ? 1 : 0) +
      (kTable ? ((F & NormFeature::gate) != 0 ? 3 : 2) *
                    (kTableF32 ? 4 / static_cast<int>(sizeof(T)) : 1)
              : 0) +
      kSampleStreams;
  // When they fit in a few registers, every step's per-column operands are loaded with the
  // row, so their first (L2 or DRAM) latency overlaps the row's instead of following the
  // reduction step by step: what a single row, or the first row of a CTA, waits on. Wider
  // rows read them per step, from L1, to keep registers for the row.
  static constexpr bool kEarlyColumns =
      kSteps * (VEC_BYTES < 4 ? 1 : VEC_BYTES / 4) * kColumnStreams <= 32;

  // The sample whose modulation rows a row reads (per-sample operands only).
  __device__ __forceinline__ static long long sample_of(const Params& p, long long row) {
    if constexpr (kPerSample) {
      return sample_index(p, row);
    } else {
      return 0;
    }
  }
  // A vector of a sample's modulation row, through L1 like a per-column operand.
  __device__ __forceinline__ static Raw<VEC_BYTES> sample_operand(const NormModulation& m,
                                                                  long long sample, int col) {
    return column_operand(modulation_row<T>(m, sample, 0), col);
  }

  __device__ __forceinline__ static Columns load_columns(const Params& p, int col,
                                                         long long sample) {
    Columns c;
    if constexpr ((F & NormFeature::weight) != 0) c.weight = column_operand(p.weight, col);
    if constexpr ((F & NormFeature::bias) != 0) c.bias = column_operand(p.bias, col);
    if constexpr (kTable && (F & NormFeature::gate) != 0) {
      c.table_gate = TableVec::load(p.gate.table, col);
    }
    if constexpr (kTable && (F & NormFeature::modulate) != 0) {
      c.table_scale = TableVec::load(p.scale.table, col);
      c.table_shift = TableVec::load(p.shift.table, col);
    }
    if constexpr (kPerSample && (F & NormFeature::gate) != 0) {
      c.gate = sample_operand(p.gate, sample, col);
    }
    if constexpr (kPerSample && (F & NormFeature::modulate) != 0) {
      c.scale = sample_operand(p.scale, sample, col);
      c.shift = sample_operand(p.shift, sample, col);
    }
    return c;
  }

  // The fused ops' sum of one vector, rounded to T: x + residual, or x + y * gate (the gate
  // plus its table row with a table). `gate` and `table_gate` are read only where present.
  __device__ __forceinline__ static Raw<VEC_BYTES> sum_vector(const Raw<VEC_BYTES>& x,
                                                              const Raw<VEC_BYTES>& second,
                                                              const Raw<VEC_BYTES>& gate,
                                                              const TableVec& table_gate) {
    Raw<VEC_BYTES> sum = x;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      float value = get_element<T>(x, i);
      if constexpr ((F & NormFeature::residual) != 0) {
        value += get_element<T>(second, i);
      } else {
        float g = get_element<T>(gate, i);
        if constexpr (kTable) g += table_gate[i];
        value += get_element<T>(second, i) * g;
      }
      set_element<T>(sum, i, value);
    }
    return sum;
  }

  // v * silu(z), or v * sigmoid(z) with z_sigmoid.
  __device__ __forceinline__ static float gated(float v, float z) {
    return times_sigmoid((F & NormFeature::z_sigmoid) != 0 ? v : v * z, z);
  }

  // One output vector: (v - mean) * rstd, then the weight, the bias and the modulation
  // (scale and shift, plus their table rows) or the output's gate z where present, stored at
  // `col` of `out_row`. `out_gate` is read only with kZGate.
  __device__ __forceinline__ static void store_output(T* out_row, int col, const Raw<VEC_BYTES>& v,
                                                      float mean, float rstd, const Columns& c,
                                                      const Raw<VEC_BYTES>& mod_scale,
                                                      const Raw<VEC_BYTES>& mod_shift,
                                                      const Raw<VEC_BYTES>& out_gate) {
    float result[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      float n = (get_element<T>(v, i) - mean) * rstd;
      if constexpr ((F & NormFeature::weight) != 0) n *= get_element<T>(c.weight, i);
      if constexpr ((F & NormFeature::bias) != 0) n += get_element<T>(c.bias, i);
      if constexpr ((F & NormFeature::modulate) != 0) {
        float a = get_element<T>(mod_scale, i);
        float b = get_element<T>(mod_shift, i);
        if constexpr (kTable) {
          a += c.table_scale[i];
          b += c.table_shift[i];
        }
        n = n * (1.0f + a) + b;
      }
      if constexpr (kZGate && !kZFirst) n = gated(n, get_element<T>(out_gate, i));
      result[i] = n;
    }
    store_floats<T, VEC_BYTES>(out_row + col, result);
  }

  template <int CTA_THREADS>
  __device__ __forceinline__ static void process(const Params& p, long long row, int lane,
                                                 bool active, const RowInputs& in) {
    constexpr float kInvHidden = 1.0f / HIDDEN;
    const long long sample = sample_of(p, row);
    Columns early[kEarlyColumns ? kSteps : 1];
    if constexpr (kEarlyColumns && kColumnStreams > 0) {
      if (active) {
#pragma unroll
        for (int step = 0; step < kSteps; ++step) {
          if (in_row(step, lane)) early[step] = load_columns(p, column(step, lane), sample);
        }
      }
    }

    // The row to normalise, held as T: x itself, or the residual stream rounded to T once
    // (which is also what is stored), so the row costs half the registers of floats for
    // 16-bit types and is exactly the stored stream. Zeros past the row, or for a thread
    // with no row, add nothing to the sums.
    Raw<VEC_BYTES> values[kSteps];
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      const bool present = active && in_row(step, lane);
      if constexpr (!kSum) {
        values[step] = in.x.v[step];
        if constexpr (kZFirst) {
          // Mamba-2's x * silu(z), rounded to T once: the row held and normalised.
#pragma unroll
          for (int i = 0; i < kVec; ++i) {
            set_element<T>(
                values[step], i,
                gated(get_element<T>(in.x.v[step], i), get_element<T>(in.second.v[step], i)));
          }
        }
#pragma unroll
        for (int w = 0; w < (VEC_BYTES < 4 ? 1 : VEC_BYTES / 4); ++w) {
          if (!present) values[step].words[w] = 0u;
        }
      } else {
#pragma unroll
        for (int w = 0; w < (VEC_BYTES < 4 ? 1 : VEC_BYTES / 4); ++w) values[step].words[w] = 0u;
        if (present) {
          TableVec table_gate;
          Raw<VEC_BYTES> gate_row;  // the gate's vector (streamed, or a per-sample row's)
          if constexpr ((F & NormFeature::gate) != 0) {
            const int col = column(step, lane);
            if constexpr (kTable) {
              table_gate = kEarlyColumns ? early[kEarlyColumns ? step : 0].table_gate
                                         : TableVec::load(p.gate.table, col);
            }
            if constexpr (kPerSample) {
              gate_row = kEarlyColumns ? early[kEarlyColumns ? step : 0].gate
                                       : sample_operand(p.gate, sample, col);
            } else {
              gate_row = in.gate.v[step];
            }
          }
          values[step] = sum_vector(in.x.v[step], in.second.v[step], gate_row, table_gate);
          T* const sum_row = static_cast<T*>(p.sum_out) + row * p.sum_row_stride;
          store_global<VEC_BYTES>(sum_row + column(step, lane), values[step]);
        }
      }
    }

    // A clustered row's sums go into the other CTAs' shared memory, which may be touched
    // only once they have started (they arrived at kernel entry; see kiln::norm_cluster).
    if constexpr (ROW_CTAS > 1) wait_for_cluster();
    float mean = 0.0f;
    float scale;
    if constexpr ((F & NormFeature::layer) != 0 && ROW_CTAS == 1) {
      // One reduction, as normalise_staged: the shift comes from registers (values[0] is
      // zero where the thread holds no vector there), so no load waits on the row's own.
      // An H200, bf16 with weight and bias, the best of a full tune's top three beside a
      // same-size copy: 8192 x 4544 1.11x its time -> 1.09x, 8192 x 5120 1.065x -> 1.052x,
      // 32768 x 2048 1.058x -> 1.046x.
      scale = layer_scale<CTA_THREADS>(
          values[0], [&](int step) { return values[step]; }, active, lane, p.eps, mean);
    } else {
      // The exact two passes: a row split over a cluster's CTAs (row_sum meets across them)
      // and RMSNorm, whose single sum needs no shift.
      if constexpr ((F & NormFeature::layer) != 0) {
        float sum = 0.0f;
#pragma unroll
        for (int step = 0; step < kSteps; ++step) {
          float partial = 0.0f;
#pragma unroll
          for (int i = 0; i < kVec; ++i) partial += get_element<T>(values[step], i);
          sum += partial;
        }
        mean = row_sum<CTA_THREADS>(sum, 0) * kInvHidden;
      }
      // One partial sum per vector keeps the dependent chains short. Elements past the row
      // are zero, but after centring they would count mean^2, so they are skipped.
      float squares = 0.0f;
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        float partial = 0.0f;
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          const float centred = get_element<T>(values[step], i) - mean;
          partial += centred * centred;
        }
        if ((F & NormFeature::layer) == 0 || in_row(step, lane)) squares += partial;
      }
      squares = row_sum<CTA_THREADS>(squares, 1);
      scale = rsqrtf(squares * kInvHidden + p.eps);
    }
    if (!active) return;

    T* const out_row = static_cast<T*>(p.out) + row * p.out_row_stride;
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      if (!in_row(step, lane)) continue;
      const int col = column(step, lane);
      Columns late;
      if constexpr (!kEarlyColumns) late = load_columns(p, col, sample);
      const Columns& c = kEarlyColumns ? early[kEarlyColumns ? step : 0] : late;
      // Per-token modulation was loaded with the row; per-sample rows come with the columns.
      const int held = kStreamedModulation ? step : 0;
      store_output(out_row, col, values[step], mean, scale, c,
                   kStreamedModulation ? in.scale.v[held] : c.scale,
                   kStreamedModulation ? in.shift.v[held] : c.shift,
                   in.second.v[kZGate ? step : 0]);
    }
  }

  // REREAD: the row is not held through the reduction. A first pass streams the inputs in
  // for the row's sums (the fused ops store their sum row); a second reads the row again,
  // from L1 or L2, to normalise. The first read of a row asks the caches to keep it
  // (evict_last) and the second to drop it first, as do the streams read once.
  // A pass that reads several streams (the fused ops' two input rows, x with per-token scale
  // and shift rows) reads one step at a time: a thread needs registers for one step rather
  // than for the whole row and the operands held with it. Measured on an H200 (bf16, 32768
  // rows): issuing both passes' loads together, four steps at once, was slower (adaln 8192
  // wide 510 -> 525 us, gated_adaln 4544 wide 515 -> 538 us), and so were the accesses
  // without the L2 priorities (gated_adaln 4544: 522 us).
  // A pass that reads only x reads all its steps in one go, as Inductor's looped reductions
  // do: the first pass of a row that is not a fused sum, and the second of one with no
  // per-token modulation. One step at a time left a thread one load in flight (rms_norm
  // 32768 x 8192, tuner's times: 272 us one step at a time, 258 in one go, 252 in one go
  // with the L1 priorities), and a plain row read in one go needs the held row's registers
  // less the reduction's.

  // A re-read row's streams, each at the thread's first vector: step s of a stream is
  // s * kStride elements further, which the unrolled passes fold into their loads as an
  // immediate offset. Indexed from the row's start instead, each step of each stream cost a
  // 64-bit multiply-add, and they and the row's sample came before the first load (SASS,
  // sm_90, adaln per-token v16.t128.c128.reread=1: first load at instruction 76).
  struct LaneStreams {
    const T* x;                // the first read: x
    const T* second;           // the residual, or y
    T* sum;                    // the fused ops' stored sum row
    const T* gate;             // gated_adaln's gate row (the token's, or the sample's)
    const TableT* table_gate;  // and its table row
    const T* again;            // the second read: the stored sum row, or x
    const T* scale;            // the modulation rows (the token's, or the sample's)
    const T* shift;
    T* out;
  };

  __device__ __forceinline__ static LaneStreams lane_streams(const Params& p, long long row,
                                                             int lane) {
    const int first = column(0, lane);
    LaneStreams s{};
    s.x = static_cast<const T*>(p.x) + row * p.x_row_stride + first;
    s.out = static_cast<T*>(p.out) + row * p.out_row_stride + first;
    s.again = s.x;
    if constexpr (kSum) {
      s.second = static_cast<const T*>(p.second) + row * p.second_row_stride + first;
      s.sum = static_cast<T*>(p.sum_out) + row * p.sum_row_stride + first;
      s.again = s.sum;
    }
    if constexpr (kTable && (F & NormFeature::gate) != 0) {
      s.table_gate = static_cast<const TableT*>(p.gate.table) + first;
    }
    return s;
  }

  // The row's sample and token (a multiply-high) and its modulation rows' starts, which only
  // a gate or a LayerNorm's shift needs before the first pass.
  __device__ __forceinline__ static void find_modulation(const Params& p, long long row, int lane,
                                                         LaneStreams& s, long long& batch,
                                                         long long& token) {
    if constexpr ((F & (NormFeature::gate | NormFeature::modulate)) != 0) {
      const int first = column(0, lane);
      batch = sample_index(p, row);
      token = row - batch * p.tokens;
      if constexpr ((F & NormFeature::gate) != 0) {
        s.gate = modulation_row<T>(p.gate, batch, token) + first;
      }
      if constexpr ((F & NormFeature::modulate) != 0) {
        s.scale = modulation_row<T>(p.scale, batch, token) + first;
        s.shift = modulation_row<T>(p.shift, batch, token) + first;
      }
    }
  }

  // A modulation operand's vector: streamed when per token, through L1 when per sample.
  __device__ __forceinline__ static Raw<VEC_BYTES> modulation_vector(const T* address) {
    if constexpr (kPerSample) {
      return load_global_nc<VEC_BYTES>(address);
    } else {
      return load_stream<VEC_BYTES, L2Priority::evict_first>(address);
    }
  }

  // A vector of the row to normalise on its first read (kept in L2 for the second), `offset`
  // elements past the thread's first: x, or for the fused ops the sum of the step's inputs,
  // rounded to T and stored.
  __device__ __forceinline__ static Raw<VEC_BYTES> first_pass_vector(const LaneStreams& s,
                                                                     int offset) {
    if constexpr (!kSum) {
      return load_stream<VEC_BYTES, L2Priority::evict_last, kInPlace>(s.x + offset);
    } else {
      const Raw<VEC_BYTES> x = load_input<VEC_BYTES, kInPlace>(s.x + offset);
      Raw<VEC_BYTES> second;
      Raw<VEC_BYTES> gate;
      TableVec table_gate;
      if constexpr ((F & NormFeature::residual) != 0) {
        second = load_input<VEC_BYTES, kInPlace>(s.second + offset);
      } else {
        second = load_global_nc<VEC_BYTES>(s.second + offset);
        gate = modulation_vector(s.gate + offset);
        if constexpr (kTable) table_gate = TableVec::load(s.table_gate, offset);
      }
      const Raw<VEC_BYTES> sum = sum_vector(x, second, gate, table_gate);
      store_global<VEC_BYTES, L2Priority::evict_last>(s.sum + offset, sum);
      return sum;
    }
  }

  // The same vector on its second read: the stored sum row (which this kernel wrote, so
  // through the coherent path), or x.
  __device__ __forceinline__ static Raw<VEC_BYTES> second_pass_vector(const LaneStreams& s,
                                                                      int offset) {
    return load_stream < VEC_BYTES, L2Priority::evict_first, kSum || kInPlace > (s.again + offset);
  }

  // LayerNorm's shifted sums subtract a value near the row's (the shift), so that one pass
  // gives mean and variance without the cancellation of sum(v^2) - sum(v)^2 when
  // |mean| >> std: the mean of the row's first vector (the fused sum's), an average so that
  // one outlying first value does not place the shift far from the rest.
  __device__ __forceinline__ static float row_shift(const Params& p, long long row, long long batch,
                                                    long long token) {
    Raw<VEC_BYTES> v = load_global<VEC_BYTES>(static_cast<const T*>(p.x) + row * p.x_row_stride);
    if constexpr (kSum) {
      const Raw<VEC_BYTES> second =
          load_global<VEC_BYTES>(static_cast<const T*>(p.second) + row * p.second_row_stride);
      Raw<VEC_BYTES> gate;
      TableVec table_gate;
      if constexpr ((F & NormFeature::gate) != 0) {
        gate = load_global<VEC_BYTES>(modulation_row<T>(p.gate, batch, token));
        if constexpr (kTable) table_gate = TableVec::load(p.gate.table, 0);
      }
      v = sum_vector(v, second, gate, table_gate);
    }
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) total += get_element<T>(v, i);
    return total * (1.0f / kVec);
  }

  // Elements of a row held by the threads of its i-th warp (lanes 32 i to 32 i + 31).
  __device__ __forceinline__ static int warp_elements(int i) {
    int vectors = 0;
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      vectors += min(max(HIDDEN / kVec - step * kRowThreads - 32 * i, 0), 32);
    }
    return vectors * kVec;
  }

  // The shift of a thread's part of a row (see shifted_moments), from registers: the mean of
  // the first vector of the row's first thread in the warp, `first` being the caller's own
  // first vector (zero where it holds none).
  __device__ __forceinline__ static float warp_shift(const Raw<VEC_BYTES>& first) {
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) total += get_element<T>(first, i);
    constexpr int kWidth = THREADS_PER_ROW < 32 ? THREADS_PER_ROW : 32;
    return __shfl_sync(0xffffffffu, total * (1.0f / kVec), 0, kWidth);
  }

  // A row's mean and variance from its threads' sums of v - shift and of their squares (in
  // the row only: past it a zero would count shift^2), in one reduction: `shift` is the same
  // across a warp's part of the row, and each warp's sums are moved to the first warp's
  // shift where they meet (sum(v - s) = S + n d and sum((v - s)^2) = Q + 2 d S + n d^2, for
  // a warp's n elements, its sums S and Q, and d its shift minus s). A row within a warp
  // needs no barrier; across warps, one, plus one before the buffer is written again.
  template <int CTA_THREADS>
  __device__ __forceinline__ static void shifted_moments(float shift, float sum, float squares,
                                                         float& mean, float& variance) {
    constexpr float kInvHidden = 1.0f / HIDDEN;
    if constexpr (THREADS_PER_ROW <= 32) {
      sum = warp_sum<THREADS_PER_ROW>(sum);
      squares = warp_sum<THREADS_PER_ROW>(squares);
    } else {
      constexpr int kWarpsPerRow = THREADS_PER_ROW / 32;
      __shared__ float4 warp_moments[CTA_THREADS / 32];
      const int warp = static_cast<int>(threadIdx.x / 32);
      sum = warp_sum<32>(sum);
      squares = warp_sum<32>(squares);
      if (threadIdx.x % 32 == 0) warp_moments[warp] = make_float4(sum, squares, shift, 0.0f);
      __syncthreads();
      // Lane i of every warp moves the row's i-th warp's sums, and a warp sum adds them up.
      const int first = warp - warp % kWarpsPerRow;
      shift = warp_moments[first].z;
      const int i = static_cast<int>(threadIdx.x % 32);
      sum = 0.0f;
      squares = 0.0f;
      if (i < kWarpsPerRow) {
        const float4 moments = warp_moments[first + i];
        const float d = moments.z - shift;
        const float n = static_cast<float>(warp_elements(i));
        sum = moments.x + n * d;
        squares = moments.y + d * (2.0f * moments.x + n * d);
      }
      sum = warp_sum<32>(sum);
      squares = warp_sum<32>(squares);
      __syncthreads();
    }
    const float shifted_mean = sum * kInvHidden;
    mean = shift + shifted_mean;
    variance = fmaxf(squares * kInvHidden - shifted_mean * shifted_mean, 0.0f);
  }

  // The sums shifted_moments takes, of one vector.
  __device__ __forceinline__ static void accumulate_shifted(const Raw<VEC_BYTES>& v, float shift,
                                                            float& sum, float& squares) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const float d = get_element<T>(v, i) - shift;
      sum += d;
      squares += d * d;
    }
  }

  // LayerNorm's 1 / std (returned) and mean of a row whose vectors the thread holds, in one
  // pass and one reduction (shifted_moments): `vector_at(step)` reads a step's vector where
  // the caller keeps it (registers or shared memory), `first` is step 0's (zero where the
  // thread holds none), whose warp's mean is the shift.
  template <int CTA_THREADS, typename VectorAt>
  __device__ __forceinline__ static float layer_scale(const Raw<VEC_BYTES>& first,
                                                      VectorAt vector_at, bool active, int lane,
                                                      float eps, float& mean) {
    const float shift = warp_shift(first);
    float sum = 0.0f;
    float squares = 0.0f;
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      if (active && in_row(step, lane)) accumulate_shifted(vector_at(step), shift, sum, squares);
    }
    float variance;
    shifted_moments<CTA_THREADS>(shift, sum, squares, mean, variance);
    return rsqrtf(variance + eps);
  }

  // Which passes of a re-read row read all their steps at once (see REREAD above).
  static constexpr bool kFirstPassTogether = !kSum;
  static constexpr bool kSecondPassTogether = !kSum && !kStreamedModulation;
  template <int CTA_THREADS>
  __device__ __forceinline__ static void process_reread(const Params& p, long long row, int lane,
                                                        bool active) {
    constexpr float kInvHidden = 1.0f / HIDDEN;
    constexpr bool kLayer = (F & NormFeature::layer) != 0;
    static_assert(!(kLayer && kInPlace), "the shift is read from a row being overwritten");
    static_assert(ROW_CTAS == 1, "a re-read row is not split over a cluster");
    static_assert(!kZGate, "a gated output's row is held");
    LaneStreams s = lane_streams(p, row, lane);
    long long batch = 0;
    long long token = 0;
    constexpr bool kSampleFirst = kLayer || (F & NormFeature::gate) != 0;
    if constexpr (kSampleFirst) find_modulation(p, row, lane, s, batch, token);
    float shift = 0.0f;
    if constexpr (kLayer) {
      if (active) shift = row_shift(p, row, batch, token);
    }
    float sum = 0.0f;
    float squares = 0.0f;
    const auto accumulate = [&](const Raw<VEC_BYTES>& v) {
      accumulate_shifted(v, shift, sum, squares);
    };
    if constexpr (kFirstPassTogether) {
      Raw<VEC_BYTES> v[kSteps];
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        if (active && in_row(step, lane)) v[step] = first_pass_vector(s, step * kStride);
      }
      if constexpr (!kSampleFirst) find_modulation(p, row, lane, s, batch, token);
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        if (active && in_row(step, lane)) accumulate(v[step]);
      }
    } else {
      if constexpr (!kSampleFirst) find_modulation(p, row, lane, s, batch, token);
#pragma unroll 1
      for (int step = 0; step < kSteps; ++step) {
        if (!(active && in_row(step, lane))) continue;
        accumulate(first_pass_vector(s, step * kStride));
      }
    }
    float mean = 0.0f;
    float variance;
    if constexpr (kLayer) {
      shifted_moments<CTA_THREADS>(shift, sum, squares, mean, variance);
    } else {
      variance = group_sum<THREADS_PER_ROW, CTA_THREADS>(squares) * kInvHidden;
    }
    const float scale = rsqrtf(variance + p.eps);
    if (!active) return;

    if constexpr (kSecondPassTogether) {
      Raw<VEC_BYTES> v[kSteps];
      Columns c[kSteps];
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        if (!in_row(step, lane)) continue;
        v[step] = second_pass_vector(s, step * kStride);
        c[step] = load_columns(p, column(step, lane), batch);
      }
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        if (!in_row(step, lane)) continue;
        store_output(s.out, step * kStride, v[step], mean, scale, c[step], c[step].scale,
                     c[step].shift, v[step]);
      }
      return;
    }
#pragma unroll 1
    for (int step = 0; step < kSteps; ++step) {
      if (!in_row(step, lane)) continue;
      const int offset = step * kStride;
      const Raw<VEC_BYTES> v = second_pass_vector(s, offset);
      Raw<VEC_BYTES> mod_scale;
      Raw<VEC_BYTES> mod_shift;
      if constexpr (kStreamedModulation) {
        mod_scale = modulation_vector(s.scale + offset);
        mod_shift = modulation_vector(s.shift + offset);
      }
      const Columns c = load_columns(p, column(step, lane), batch);
      store_output(s.out, offset, v, mean, scale, c, kStreamedModulation ? mod_scale : c.scale,
                   kStreamedModulation ? mod_shift : c.shift, v);
    }
  }

  // STAGED: the row's streams are copied into shared memory (cp.async), not into registers.
  // A copy in flight holds no register, so a thread needs registers for one step at a time
  // and an SM keeps as many rows in flight as its shared memory holds: more than registers
  // allow for wide rows. Each thread stages its own vectors and reads back only those, so
  // no barrier is needed. Slots: stream s, step k of thread t at
  //   ((s * kSteps + k) * CTA_THREADS + t) * VEC_BYTES,
  // so a warp's accesses to one slot are contiguous. The math is process()'s, step by step.
  static constexpr int kStagedGate = !kPerSample && (F & NormFeature::gate) != 0 ? 1 : 0;
  static constexpr int kStagedModulation = kStreamedModulation ? 2 : 0;
  static constexpr int kStagedStreams = 1 + (kSum ? 1 : 0) + kStagedGate + kStagedModulation;

  static constexpr int kStagedX = 0;
  static constexpr int kStagedSecond = 1;
  static constexpr int kStagedGateSlot = kSum ? 2 : 1;
  static constexpr int kStagedScale = kStagedGateSlot + kStagedGate;
  static constexpr int kStagedShift = kStagedScale + 1;

  template <int CTA_THREADS>
  __device__ __forceinline__ static unsigned staged_slot(unsigned thread_slots, int stream,
                                                         int step) {
    return thread_slots + static_cast<unsigned>((stream * kSteps + step) * CTA_THREADS * VEC_BYTES);
  }

  // Starts copying the row's streams into the thread's slots (a thread with a row only).
  template <int CTA_THREADS>
  __device__ __forceinline__ static void stage_row(const Params& p, long long row, int lane,
                                                   unsigned thread_slots) {
    const auto slot = [&](int stream, int step) {
      return staged_slot<CTA_THREADS>(thread_slots, stream, step);
    };
    long long batch = 0;
    long long token = 0;
    if constexpr (!kPerSample && (F & (NormFeature::gate | NormFeature::modulate)) != 0) {
      batch = sample_index(p, row);
      token = row - batch * p.tokens;
    }
    const T* const x_row = static_cast<const T*>(p.x) + row * p.x_row_stride;
    const T* second_row = nullptr;  // the residual, or y
    if constexpr (kSum) second_row = static_cast<const T*>(p.second) + row * p.second_row_stride;
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      if (!in_row(step, lane)) continue;
      const int col = column(step, lane);
      copy_to_shared_async<VEC_BYTES>(slot(kStagedX, step), x_row + col);
      if constexpr (kSum) {
        copy_to_shared_async<VEC_BYTES>(slot(kStagedSecond, step), second_row + col);
      }
      if constexpr (kStagedGate != 0) {
        copy_to_shared_async<VEC_BYTES>(slot(kStagedGateSlot, step),
                                        modulation_row<T>(p.gate, batch, token) + col);
      }
      if constexpr (kStagedModulation != 0) {
        copy_to_shared_async<VEC_BYTES>(slot(kStagedScale, step),
                                        modulation_row<T>(p.scale, batch, token) + col);
        copy_to_shared_async<VEC_BYTES>(slot(kStagedShift, step),
                                        modulation_row<T>(p.shift, batch, token) + col);
      }
    }
  }

  // Normalises the row whose copies into the thread's slots have completed.
  template <int CTA_THREADS>
  __device__ __forceinline__ static void normalise_staged(const Params& p, long long row, int lane,
                                                          bool active, unsigned thread_slots) {
    constexpr float kInvHidden = 1.0f / HIDDEN;
    static_assert(ROW_CTAS == 1, "a staged row is not split over a cluster");
    static_assert(!kZGate, "a gated output's row is held");
    constexpr int kX = kStagedX;
    constexpr int kSecond = kStagedSecond;
    constexpr int kGate = kStagedGateSlot;
    constexpr int kScale = kStagedScale;
    constexpr int kShift = kStagedShift;
    const auto slot = [&](int stream, int step) {
      return staged_slot<CTA_THREADS>(thread_slots, stream, step);
    };
    const long long sample = sample_of(p, row);

    // The fused ops' sum, rounded to T, stored and written over x's slot: the row to
    // normalise, as process() holds it.
    if constexpr (kSum) {
      if (active) {
        T* const sum_row = static_cast<T*>(p.sum_out) + row * p.sum_row_stride;
#pragma unroll
        for (int step = 0; step < kSteps; ++step) {
          if (!in_row(step, lane)) continue;
          const int col = column(step, lane);
          Raw<VEC_BYTES> v = load_shared<VEC_BYTES>(slot(kX, step));
          const Raw<VEC_BYTES> second = load_shared<VEC_BYTES>(slot(kSecond, step));
          Raw<VEC_BYTES> gate_row;
          TableVec table_gate;
          if constexpr ((F & NormFeature::gate) != 0) {
            gate_row = kPerSample ? sample_operand(p.gate, sample, col)
                                  : load_shared<VEC_BYTES>(slot(kGate, step));
            if constexpr (kTable) table_gate = TableVec::load(p.gate.table, col);
          }
          v = sum_vector(v, second, gate_row, table_gate);
          store_global<VEC_BYTES>(sum_row + col, v);
          store_shared<VEC_BYTES>(slot(kX, step), v);
        }
      }
    }

    float mean = 0.0f;
    float scale;
    if constexpr ((F & NormFeature::layer) != 0) {
      // One pass over the staged row and one reduction (shifted_moments), where the exact
      // two passes took two: an H200, bf16 with weight and bias, 8192 x 14848 at
      // v16.t256.c256.stage=1 ran 1.11x a same-size copy's time -> 1.06x (8192 x 8192: the
      // same). Held rows (process) do the same from their registers; a shift read from
      // memory had made the persistent grids that prefetch rows slower (8192 x 4544: 1.10x
      // -> 1.15x).
      Raw<VEC_BYTES> first;
#pragma unroll
      for (int w = 0; w < (VEC_BYTES < 4 ? 1 : VEC_BYTES / 4); ++w) first.words[w] = 0u;
      if (active && in_row(0, lane)) first = load_shared<VEC_BYTES>(slot(kX, 0));
      scale = layer_scale<CTA_THREADS>(
          first, [&](int step) { return load_shared<VEC_BYTES>(slot(kX, step)); }, active, lane,
          p.eps, mean);
    } else {
      float squares = 0.0f;
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        if (!(active && in_row(step, lane))) continue;
        const Raw<VEC_BYTES> v = load_shared<VEC_BYTES>(slot(kX, step));
        float partial = 0.0f;
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          const float element = get_element<T>(v, i);
          partial += element * element;
        }
        squares += partial;
      }
      squares = group_sum<THREADS_PER_ROW, CTA_THREADS>(squares);
      scale = rsqrtf(squares * kInvHidden + p.eps);
    }
    if (!active) return;

    T* const out_row = static_cast<T*>(p.out) + row * p.out_row_stride;
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      if (!in_row(step, lane)) continue;
      const int col = column(step, lane);
      const Raw<VEC_BYTES> v = load_shared<VEC_BYTES>(slot(kX, step));
      const Columns c = load_columns(p, col, sample);
      Raw<VEC_BYTES> mod_scale = c.scale;
      Raw<VEC_BYTES> mod_shift = c.shift;
      if constexpr (kStagedModulation != 0) {
        mod_scale = load_shared<VEC_BYTES>(slot(kScale, step));
        mod_shift = load_shared<VEC_BYTES>(slot(kShift, step));
      }
      store_output(out_row, col, v, mean, scale, c, mod_scale, mod_shift, v);
    }
  }
};

template <typename T, int HIDDEN, int VEC_BYTES, int THREADS_PER_ROW, int CTA_THREADS,
          unsigned FEATURES, bool PREFETCH, bool REREAD>
__global__ void __launch_bounds__(CTA_THREADS) norm(const NormArgs<FEATURES> p) {
  begin_dependent_grid();
  using Row = NormRow<T, HIDDEN, VEC_BYTES, THREADS_PER_ROW, FEATURES>;
  constexpr int kRowsPerCta = CTA_THREADS / THREADS_PER_ROW;
  static_assert(VEC_BYTES % sizeof(T) == 0, "a vector holds whole elements");
  static_assert(HIDDEN % Row::kVec == 0, "rows must be made of whole vectors");
  static_assert(CTA_THREADS % THREADS_PER_ROW == 0, "rows must tile the CTA");
  static_assert(THREADS_PER_ROW <= 32 ? (THREADS_PER_ROW & (THREADS_PER_ROW - 1)) == 0
                                      : THREADS_PER_ROW % 32 == 0,
                "a row's threads are a power of two up to a warp, or whole warps");

  const int lane = static_cast<int>(threadIdx.x % THREADS_PER_ROW);
  const long long grid_rows = static_cast<long long>(gridDim.x) * kRowsPerCta;
  long long row = static_cast<long long>(blockIdx.x) * kRowsPerCta +
                  static_cast<int>(threadIdx.x / THREADS_PER_ROW);

  static_assert(!(PREFETCH && REREAD), "a re-read row is not prefetched");
  // Without a persistent grid the grid covers the rows (the host sets row_loop where it
  // cannot), so a thread makes one pass. Kept out of the loop, a row's pointers and the cache
  // policies are not held across iterations: SASS, sm_90, adaln per-token 4096 wide, re-read
  // v16.t128.c128 62 -> 40 registers, held v16.t256.c256 112 -> 64.
  constexpr bool kLoop = PREFETCH || (FEATURES & NormFeature::row_loop) != 0;
  typename Row::RowInputs current;
  if (PREFETCH && row < p.rows) Row::load_row(p, row, lane, current);
  // Every thread runs the same number of iterations, even past the last row, because the
  // row reduction may synchronise the whole CTA.
  for (long long first_row = static_cast<long long>(blockIdx.x) * kRowsPerCta; first_row < p.rows;
       first_row += grid_rows, row += grid_rows) {
    const bool active = row < p.rows;
    if constexpr (REREAD) {
      Row::template process_reread<CTA_THREADS>(p, row, lane, active);
    } else if constexpr (PREFETCH) {
      typename Row::RowInputs next;
      if (row + grid_rows < p.rows) Row::load_row(p, row + grid_rows, lane, next);
      Row::template process<CTA_THREADS>(p, row, lane, active, current);
      current = next;
    } else {
      if (active) Row::load_row(p, row, lane, current);
      Row::template process<CTA_THREADS>(p, row, lane, active, current);
    }
    if constexpr (!kLoop) break;
  }
}

// The staged form (NormRow::stage_row, then normalise_staged): one row per THREADS_PER_ROW
// threads, dynamic shared memory of kStagedStreams x kSteps x CTA_THREADS vectors, and a
// grid that covers the rows (with a grid-stride loop only past 2^31 CTAs' worth: row_loop). A
// persistent grid copying each thread's next row into a second buffer while it normalises the
// current one measured no faster on an H200 (bf16, 8192-32768 rows of 8192), so there is none.
template <typename T, int HIDDEN, int VEC_BYTES, int THREADS_PER_ROW, int CTA_THREADS,
          unsigned FEATURES>
__global__ void __launch_bounds__(CTA_THREADS) norm_staged(const NormArgs<FEATURES> p) {
  begin_dependent_grid();
  using Row = NormRow<T, HIDDEN, VEC_BYTES, THREADS_PER_ROW, FEATURES>;
  constexpr int kRowsPerCta = CTA_THREADS / THREADS_PER_ROW;
  static_assert(VEC_BYTES >= 4 && VEC_BYTES % sizeof(T) == 0, "cp.async copies 4 to 16 bytes");
  static_assert(HIDDEN % Row::kVec == 0, "rows must be made of whole vectors");
  static_assert(CTA_THREADS % THREADS_PER_ROW == 0, "rows must tile the CTA");
  static_assert(THREADS_PER_ROW <= 32 ? (THREADS_PER_ROW & (THREADS_PER_ROW - 1)) == 0
                                      : THREADS_PER_ROW % 32 == 0,
                "a row's threads are a power of two up to a warp, or whole warps");
  extern __shared__ __align__(16) unsigned char staged_rows[];
  const unsigned thread_slots = shared_address(staged_rows) + threadIdx.x * VEC_BYTES;

  const int lane = static_cast<int>(threadIdx.x % THREADS_PER_ROW);
  const long long grid_rows = static_cast<long long>(gridDim.x) * kRowsPerCta;
  long long row = static_cast<long long>(blockIdx.x) * kRowsPerCta +
                  static_cast<int>(threadIdx.x / THREADS_PER_ROW);
  // Every thread runs the same number of iterations (the reduction may synchronise the CTA).
  for (long long first_row = static_cast<long long>(blockIdx.x) * kRowsPerCta; first_row < p.rows;
       first_row += grid_rows, row += grid_rows) {
    const bool active = row < p.rows;
    if (active) Row::template stage_row<CTA_THREADS>(p, row, lane, thread_slots);
    wait_for_shared_copies();
    Row::template normalise_staged<CTA_THREADS>(p, row, lane, active, thread_slots);
    if constexpr ((FEATURES & NormFeature::row_loop) == 0) break;  // one pass, as kiln::norm
  }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// CLUSTER: each row is split over the ROW_CTAS CTAs of a thread-block cluster (sm_90), each
// holding its slice as kiln::norm does, so that a few wide rows are read by ROW_CTAS times
// as many SMs: one SM alone has too few loads in flight to stream a wide row at DRAM speed.
// The row's sums meet in distributed shared memory (cluster_sum). One row per cluster: a
// grid of rows x ROW_CTAS CTAs. Declared only where NVRTC accepts __cluster_dims__.
template <typename T, int HIDDEN, int VEC_BYTES, int CTA_THREADS, int ROW_CTAS, unsigned FEATURES>
__global__ void __cluster_dims__(ROW_CTAS, 1, 1) __launch_bounds__(CTA_THREADS)
    norm_cluster(const NormArgs<FEATURES> p) {
  begin_dependent_grid();
  using Row = NormRow<T, HIDDEN, VEC_BYTES, CTA_THREADS, FEATURES, ROW_CTAS>;
  static_assert(VEC_BYTES % sizeof(T) == 0, "a vector holds whole elements");
  static_assert(HIDDEN % Row::kVec == 0, "rows must be made of whole vectors");
  static_assert(CTA_THREADS % 32 == 0, "a clustered CTA is whole warps");
  // The same for every CTA of a cluster, so a cluster past the rows leaves as a whole.
  const long long row = static_cast<long long>(blockIdx.x / ROW_CTAS);
  if (row >= p.rows) return;
  // Paired with the wait in NormRow::process, before the first sum reaches another CTA.
  arrive_at_cluster();
  const int lane = static_cast<int>(cluster_rank()) * CTA_THREADS + static_cast<int>(threadIdx.x);
  typename Row::RowInputs in;
  Row::load_row(p, row, lane, in);
  Row::template process<CTA_THREADS>(p, row, lane, true, in);
}
#endif  // clusters: sm_90 and later

}  // namespace kiln
