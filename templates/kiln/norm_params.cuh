// The by-value parameter of kiln::norm, the kernel behind rms_norm, fused_add_rms_norm,
// layer_norm, adaln and gated_adaln. Included by the kernel template and by host code that
// fills it, so it holds plain data only and includes nothing but the plain divisor. Pointers
// a specialisation does not use are null; strides are in elements.
#pragma once

#include "kiln/divisor.cuh"

namespace kiln {

// Bits of kiln::norm's FEATURES argument (the family descriptor derives them from the op
// and the problem's flags).
struct NormFeature {
  static constexpr unsigned layer = 1u;       // subtract the mean (LayerNorm), else RMS
  static constexpr unsigned weight = 2u;      // multiply by weight[i]
  static constexpr unsigned bias = 4u;        // add bias[i]
  static constexpr unsigned residual = 8u;    // s = x + residual, stored to sum_out
  static constexpr unsigned gate = 16u;       // s = x + y * gate, stored to sum_out
  static constexpr unsigned modulate = 32u;   // * (1 + scale) + shift
  static constexpr unsigned table = 64u;      // modulation operands add a table row
  static constexpr unsigned in_place = 128u;  // outputs alias inputs: coherent loads
  // The modulation operands are one row per sample ([B, 1, D]): every row of a sample reads
  // the same one, so they are read where used, through L1, like the per-column operands,
  // instead of streamed and held with the row.
  static constexpr unsigned per_sample = 256u;
  // More rows than a grid of one pass covers (2^31 - 1 CTAs): the threads loop over them. Set
  // by the host only for such calls; every other launch without a persistent grid is one
  // pass, with no loop's bookkeeping in its registers.
  static constexpr unsigned row_loop = 512u;
  // The table rows are fp32 where x is a 16-bit type (diffusers' fp32 scale_shift_table, as
  // Wan keeps it, added to x's-dtype operands in fp32).
  static constexpr unsigned table_f32 = 1024u;
  // rms_norm_gated: z, a row of x's shape, is read as the second stream, and the output is
  // multiplied by silu(z) (sigmoid(z) with z_sigmoid): the gated norm that closes the linear
  // attention of Qwen3-Next and its kin. With z_first, x is multiplied instead, before it is
  // normalised (Mamba-2's gated norm).
  static constexpr unsigned z_gate = 2048u;
  static constexpr unsigned z_sigmoid = 4096u;
  static constexpr unsigned z_first = 8192u;
  // Not a bit of its own: the features that read a second row stream through p.second (the
  // residual, y, or z), which the layout, the row's loads and the family's counts share.
  static constexpr unsigned second_row = residual | gate | z_gate;
};

// A modulation operand (scale, shift or gate) of shape [B, T or 1, D]: element (b, t, i) is
// at data[b * batch_stride + t * token_stride + i] (token_stride 0 broadcasts over tokens),
// plus table[i] when the kernel adds a table row (diffusers' scale_shift_table), so that
// table + temb is never materialised.
struct NormModulation {
  const void* data;
  const void* table;
  long long batch_stride;
  long long token_stride;
};

// The kernel's parameter comes in four layouts, made of the pieces below that its features
// read, and a kernel takes only its own (NormArgs): a launch's parameter block costs time by
// its size. On an H200 a 4096-wide bf16 RMSNorm of 1 or 128 rows, launched as kiln launches
// it, took the same time with 24 to 160 bytes of parameters, 0.1 us longer with 192 and 0.2 us
// with 240 (bench/diagnostics/one_row.cu); kiln's own rms_norm and fused_add_rms_norm calls
// took 0.2-0.7 us less with their layouts of 64 and 96 bytes than with the 240 bytes all
// specialisations took before. The host fills a NormParams (every piece) and launches with
// the bytes of the problem's layout (pack_norm_args in templates/norm_family.h).
//
// What every specialisation reads, first and together: a single row is waited on from its
// first instruction, and each constant-cache line of the parameters it touches is a miss
// before its first load can issue.
struct NormCoreParams {
  void* out;      // the normalised (and modulated) rows
  const void* x;  // the rows to normalise (h for gated_adaln)
  const void* weight;
  const void* bias;
  long long rows;
  long long x_row_stride;
  long long out_row_stride;
  float eps;
  unsigned unused;  // explicit padding: every piece is a whole number of 8-byte words
};

// fused_add_rms_norm and gated_adaln: the sum of x and a second row is stored and normalised;
// rms_norm_gated: the second row is the output's gate z (sum_out unused).
struct NormSumParams {
  void* sum_out;       // the new residual stream (x + residual, or h + y * gate)
  const void* second;  // fused_add_rms_norm: the residual added to x; gated_adaln: y
  long long second_row_stride;
  long long sum_row_stride;
};

// adaln and gated_adaln: the modulation's scale and shift, found by a row's sample.
struct NormModulationParams {
  long long tokens;  // rows per sample (T), to find a row's modulation operands
  // tokens as a multiply-high magic: a row's sample without a 64-bit division on the way to
  // the row's first load.
  Divisor tokens_divisor;
  NormModulation scale;
  NormModulation shift;
};

// gated_adaln: the gate of y.
struct NormGateParams {
  NormModulation gate;
};

// The layouts: each piece a base, in this order, so each starts where the one before ends.
struct NormPlainArgs : NormCoreParams {};
struct NormSumArgs : NormCoreParams, NormSumParams {};
struct NormModulatedArgs : NormCoreParams, NormModulationParams {};
// Padded past 256 bytes: on an H200 (driver 580), launched as kiln launches on sm_90
// (programmatic stream serialization), a call took 0.1-0.2 us longer with 200-270 bytes of
// parameters than with up to 160, and only 0.03-0.06 us longer with 288 bytes to 1 KB
// (bench/diagnostics/one_row.cu); the gated layout's own 224 bytes fall in the dear range.
struct NormGatedArgs : NormCoreParams, NormSumParams, NormModulationParams, NormGateParams {
  unsigned char unused[64];
};

// What the host fills for every op: every piece, laid out as the gated layout.
struct NormParams : NormGatedArgs {};

// Checked by NVRTC and by the host compiler alike: every piece is a whole number of 8-byte
// words with no padding of the compiler's, so the layouts' sizes are the sums of theirs.
static_assert(sizeof(NormModulation) == 32 && sizeof(Divisor) == 24);
static_assert(sizeof(NormCoreParams) == 64 && sizeof(NormSumParams) == 32 &&
              sizeof(NormModulationParams) == 96 && sizeof(NormGateParams) == 32);
static_assert(sizeof(NormPlainArgs) == 64 && sizeof(NormSumArgs) == 96 &&
              sizeof(NormModulatedArgs) == 160 && sizeof(NormGatedArgs) == 288 &&
              sizeof(NormParams) == 288);

// The layout of FEATURES (a gate comes only with modulation).
template <bool GATE, bool MODULATE, bool SUM>
struct NormLayout {
  using type = NormPlainArgs;
};
template <bool SUM>
struct NormLayout<true, true, SUM> {
  using type = NormGatedArgs;
};
template <bool SUM>
struct NormLayout<false, true, SUM> {
  using type = NormModulatedArgs;
};
template <>
struct NormLayout<false, false, true> {
  using type = NormSumArgs;
};

// The layout a kernel of FEATURES takes, as a type of its own so that the kernel's name
// reads kiln::norm<...>(kiln::NormArgs<F>) in profiles.
template <unsigned FEATURES>
struct NormArgs
    : NormLayout<(FEATURES & NormFeature::gate) != 0, (FEATURES & NormFeature::modulate) != 0,
                 (FEATURES & NormFeature::second_row) != 0>::type {};

#ifndef __CUDACC_RTC__
// Sets the rows per sample and their magic together.
inline void set_tokens(NormParams& params, long long tokens) {
  params.tokens = tokens;
  params.tokens_divisor = make_divisor(static_cast<unsigned long long>(tokens));
}
#endif

}  // namespace kiln
