// The by-value parameters of kiln::rope and kiln::rms_norm_rope. Included by the kernel
// templates and by host code that fills them, so they hold plain data only and include
// nothing but the plain divisor. Strides are in elements; a stride of 0 broadcasts (cos/sin
// over the batch).
#pragma once

#include "kiln/divisor.cuh"

namespace kiln {

// How kiln::rope finds a thread's rows (its FORM template argument; see rope.cuh).
enum RopeForm : int {
  kRopeGeneral = 0,    // rows placed one by one: they may cross from q to k or tokens
  kRopeGrouped = 1,    // a group of one token's heads in one tensor, a head stride apart
  kRopeTokenPair = 2,  // one token's q row and k row (q and k one head each)
};

// LTX-Video's rotary angles, computed from a token's (frame, row, column) instead of read
// from a table. Token s of a sequence is at frame s / (height * width), row
// (s / width) % height, column s % width. The angle of rotation pair p of a row of `dim`
// elements (dim = the rotated width) is, for p >= pad_pairs,
//   freq(i) * (2 * coordinate[a] * scale[a] - 1),  j = p - pad_pairs, i = j / 3, a = j % 3,
//   freq(i) = theta ** (i / (dim / 6 - 1)) * pi / 2,
// and 0 (cos 1, sin 0) for the dim % 6 lanes at the front (pad_pairs = (dim % 6) / 2).
struct RopeVideoGrid {
  int frames;
  int height;
  int width;
  int pad_pairs;
  float scale[3];        // per axis: interpolation scale * patch size / base size (or 1)
  float log2_freq_step;  // log2(theta) / (dim / 6 - 1); 0 when dim / 6 == 1
  // width and height as multiply-high magics: a token's coordinates without run-time
  // divisions on the way to its angles.
  Divisor width_divisor;
  Divisor height_divisor;
};

// kiln::rope's RMSNorm of each head before its rotation (HEAD_NORM): q's heads take
// q_weight, k's k_weight (HEAD_DIM elements each, of the data's dtype; null: no weight).
// A normalising call has a table, never video angles, so the two share space and the
// parameters keep their size.
struct RopeHeadNorm {
  const void* q_weight;
  const void* k_weight;
  float eps;
  int pad0;
};

// Rows are (token, head) pairs, the first heads_q heads of q and the rest of k, in one of
// two orders, whichever follows memory:
//  - heads inner (positions_inner == 0; [B, S, H, D] data, heads contiguous): token-major,
//    row r is head r % (heads_q + heads_k) of token r / (heads_q + heads_k). Tokens are
//    position-major, token t = position t / batch of batch entry t % batch, so the rows that
//    share cos/sin (all heads of a position; all batch entries too when cos/sin broadcast
//    over the batch, and always for video angles) are neighbours.
//  - positions inner (positions_inner != 0; [B, H, S, D] data, a head's positions
//    contiguous): rows come in panels of P consecutive tokens (P = a CTA's row slots) x all
//    heads, head-major within the panel, so neighbouring slots read neighbouring positions of
//    one head. Tokens are batch-major here, token t = position t % seq of entry t / seq. A
//    thread's rows are P apart: the same token in consecutive heads, sharing cos/sin.
// Either way a thread loads cos/sin once for its rows that share them. The grouped form of
// kiln::rope walks positions-inner rows in panels of its own (panel_tokens; see rope.cuh).
struct RopeParams {
  void* q_out;
  void* k_out;
  const void* q;
  const void* k;
  const void* cos;  // table mode only
  const void* sin;
  long long rows;  // tokens * (heads_q + heads_k), < 2^31
  int batch;
  int heads_q;
  int heads_k;
  int positions_inner;  // the row order above
  int tokens;           // rows / (heads_q + heads_k)
  int seq;              // tokens / batch
  // heads_q + heads_k, batch and seq as multiply-high magics: a row's token and head, and a
  // token's entry and position, are found without a run-time division (some 20 dependent
  // instructions each) before the row's loads can issue. Set by set_row_order.
  Divisor heads_divisor;
  Divisor batch_divisor;
  Divisor seq_divisor;
  // The grouped form's panels, positions inner (unset otherwise): panel_tokens tokens each
  // (at most `tokens`), the last one last_panel_tokens, as magics.
  Divisor panel_divisor;
  Divisor last_panel_divisor;
  int panel_tokens;
  int last_panel_tokens;
  long long q_strides[3];  // batch, position, head
  long long k_strides[3];
  long long q_out_strides[3];
  long long k_out_strides[3];
  long long cos_strides[2];  // batch, position (the last dimension is contiguous)
  long long sin_strides[2];
  union {
    RopeVideoGrid video;     // rope_3d
    RopeHeadNorm head_norm;  // HEAD_NORM
  };
};

#ifndef __CUDACC_RTC__
// The grouped form's panel, positions inner: the tokens whose rows of one head make about
// 1 MB (a power of two, at least 1, at most `tokens`). A panel's group of heads streams that
// much of each head, and the next group re-reads the panel's cos/sin rows a few MB later,
// while L2 still holds them.
inline int rope_panel_tokens(long long row_bytes, long long tokens) {
  long long panel = 1;
  while (panel * 2 * row_bytes <= (1LL << 20)) panel *= 2;
  return static_cast<int>(panel < tokens ? panel : (tokens > 0 ? tokens : 1));
}

// Sets the rows, their order and the counts and magics the kernel derives rows' places from;
// row_bytes (head dim x element size) sizes the grouped form's panels.
inline void set_row_order(RopeParams& params, long long rows, int batch, int heads_q, int heads_k,
                          bool positions_inner, long long row_bytes) {
  const long long heads = static_cast<long long>(heads_q) + heads_k;
  params.rows = rows;
  params.batch = batch;
  params.heads_q = heads_q;
  params.heads_k = heads_k;
  params.positions_inner = positions_inner ? 1 : 0;
  params.tokens = static_cast<int>(heads > 0 ? rows / heads : 0);
  params.seq = batch > 0 ? params.tokens / batch : 0;
  params.heads_divisor = make_divisor(static_cast<unsigned long long>(heads));
  params.batch_divisor = make_divisor(static_cast<unsigned long long>(batch));
  params.seq_divisor = make_divisor(static_cast<unsigned long long>(params.seq));
  if (!positions_inner) return;  // only the positions-inner walk has panels: no magic per call
  params.panel_tokens = rope_panel_tokens(row_bytes, params.tokens);
  const int last = params.tokens % params.panel_tokens;
  params.last_panel_tokens = last == 0 ? params.panel_tokens : last;
  params.panel_divisor = make_divisor(static_cast<unsigned long long>(params.panel_tokens));
  params.last_panel_divisor =
      make_divisor(static_cast<unsigned long long>(params.last_panel_tokens));
}
#endif

// One row is one token: q's and k's rows of `width` elements, each RMS-normalised over the
// whole width with its own weight, then rotated in interleaved pairs over the whole width.
// Tokens are in (batch, position) order: token t is position t % seq_len of batch entry
// t / seq_len.
struct RmsNormRopeParams {
  void* q_out;
  void* k_out;
  const void* q;
  const void* k;
  const void* q_weight;
  const void* k_weight;
  const void* cos;  // table mode only
  const void* sin;
  long long rows;
  long long seq_len;
  Divisor seq_len_divisor;  // seq_len as a multiply-high magic (set_seq_len sets both)
  long long q_strides[2];   // batch, position
  long long k_strides[2];
  long long q_out_strides[2];
  long long k_out_strides[2];
  long long cos_strides[2];
  long long sin_strides[2];
  float eps;
  int pad0;
  RopeVideoGrid video;
};

#ifndef __CUDACC_RTC__
inline void set_seq_len(RmsNormRopeParams& params, long long seq_len) {
  params.seq_len = seq_len;
  params.seq_len_divisor = make_divisor(static_cast<unsigned long long>(seq_len));
}
#endif

}  // namespace kiln
