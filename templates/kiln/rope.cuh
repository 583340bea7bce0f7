// Rotary position embedding of q and k in one launch:
//   half-split (transformers' rotate_half): for i < R/2, with h = R/2,
//     out[i]     = x[i] * cos[i]     - x[i + h] * sin[i]
//     out[i + h] = x[i + h] * cos[i + h] + x[i] * sin[i + h]
//   interleaved (diffusers' use_real_unbind_dim=-1): for pairs (2j, 2j + 1) < R,
//     out[2j]     = x[2j] * cos[2j]         - x[2j + 1] * sin[2j]
//     out[2j + 1] = x[2j + 1] * cos[2j + 1] + x[2j] * sin[2j + 1]
// over the first R = ROTARY_DIM of HEAD_DIM elements (the rest is copied when out of place
// and left alone in place, where the output is the input), math in fp32,
// rounded once. cos/sin come from a table row per token (TABLE = float or T) or, for
// VIDEO, from the token's video coordinates (interleaved only). A HALF_TABLE row holds R / 2
// angles, one a rotation pair (cos[i] for the pair (i, i + h), cos[j] for (2j, 2j + 1)): the
// tables GPT-OSS's rotary embedding and vLLM's cos/sin caches make, and transformers' [.., R]
// tables cut to their first half, whose second half repeats it. The formulas above then read
// cos[i + h] = cos[i] (half-split) and cos[2j + 1] = cos[2j] = the row's cos[j] (interleaved).
//
// INVERSE applies the transpose of that map instead, which is RoPE's backward (dx from dy):
// with the 90-degree turn J (half-split: (a, b) -> (-b, a); interleaved: (re, im) ->
// (-im, re)) the forward is out = x * cos + J(x) * sin, so its transpose is
// dx = dy * cos - J(dy * sin) (J^T = -J), i.e.
//   half-split:  dx[i] = dy[i] * cos[i] + dy[i + h] * sin[i + h],
//                dx[i + h] = dy[i + h] * cos[i + h] - dy[i] * sin[i]
//   interleaved: dx[2j] = dy[2j] * cos[2j] + dy[2j + 1] * sin[2j + 1],
//                dx[2j + 1] = dy[2j + 1] * cos[2j + 1] - dy[2j] * sin[2j]
// When both halves of a pair share an angle (every model's table) this is the rotation by
// the negative angle; the transpose is also exact for a table whose halves differ. The
// unrotated columns' gradient passes through as their values do. No negated sin is formed:
// the sign is in the code.
//
// A row is one head of one token, in the order RopeParams describes. A row is split among
// THREADS_PER_ROW threads; each owns whole rotation units (a vector and, half-split, its
// partner vector R/2 further), so no data crosses threads. A thread handles ROWS_PER_THREAD
// rows (consecutive heads of a token, or, heads inner, consecutive rows): all their loads
// are issued first, and cos/sin are loaded (or computed) once and kept in registers while
// consecutive rows share them.
//
// FORM (RopeForm) says how a thread finds its rows. kRopeGeneral places them one by one,
// since they may cross from q to k or into the next token. kRopeGrouped (the host's choice
// where ROWS_PER_THREAD divides both head counts, and always for one row a thread): a
// thread's rows are a group of ROWS_PER_THREAD consecutive heads of one token in one of q and
// k, so they share cos/sin by construction and lie a head stride apart. kRopeTokenPair (two
// rows a thread where q and k have one head each, as diffusers' [B, S, H * D] rows before the
// head split and every rope_3d call have): a thread's rows are one token's q row and k row.
// Either way a thread finds one place, and no row needs the checks that rows crossing from q
// to k or into the next token do. That bookkeeping costs the general form registers and
// instructions: for the FLUX-like call's 4 rows a thread (sm_90), 72 registers and 872 SASS
// instructions, against 56 and 352 grouped.
//
// DEINTERLEAVE (half-split only) rotates the de-interleaved row: the input's first R columns
// are taken as x'[j] = x[2j], x'[j + h] = x[2j + 1] and rotated as above, so adjacent input
// pairs come out R/2 apart: DeepSeek-V3's apply_rotary_pos_emb_interleave (its MLA's
// rope_interleave), whose output is rotate_half's layout. A thread's unit is then two adjacent
// input vectors (kVec pairs) and the two output vectors R/2 apart that they become; INVERSE, the
// transpose, reads R/2 apart and writes adjacent. Threads write other threads' input columns,
// so the host never runs it in place.
//
// HEAD_NORM first RMS-normalises each row (one head: x * rsqrt(mean(x^2) + eps) * weight over
// all HEAD_DIM columns, q's heads with q's weight and k's with k's), rounded to T as a separate
// norm's output is, then rotates that: Qwen3's, Gemma 3's and FLUX's per-head q/k norms and
// their RoPE in one pass over q and k instead of three. A row's threads sit in one warp
// (THREADS_PER_ROW <= 32), so its sum of squares meets by shuffles, with no barrier; the
// unrotated columns are normalised and stored in place too.
#pragma once

#include "kiln/common.cuh"
#include "kiln/dependent_launch.cuh"
#include "kiln/rope_angles.cuh"
#include "kiln/rope_params.cuh"

namespace kiln {

// A division on a path few rows take, kept out of line so that the compiler cannot evaluate it
// for every row alongside the common path (as it does with both arms of a select).
__device__ __noinline__ unsigned divide_rarely(unsigned dividend, unsigned divisor) {
  return dividend / divisor;
}

template <typename T, typename TABLE, int HEAD_DIM, int ROTARY_DIM, int VEC_BYTES,
          int THREADS_PER_ROW, int CTA_THREADS, int ROWS_PER_THREAD, bool INTERLEAVED, bool VIDEO,
          bool INVERSE, bool PREFETCH, int FORM, bool HALF_TABLE = false, bool HEAD_NORM = false,
          bool DEINTERLEAVE = false>
__global__ void __launch_bounds__(CTA_THREADS) rope(const RopeParams p) {
  begin_dependent_grid();
  constexpr int kVec = VEC_BYTES / static_cast<int>(sizeof(T));
  constexpr int kParts = INTERLEAVED ? 1 : 2;                // vectors per rotation unit
  constexpr int kUnitWidth = INTERLEAVED ? kVec : 2 * kVec;  // angles per unit
  constexpr int kRotUnits = INTERLEAVED ? ROTARY_DIM / kVec : ROTARY_DIM / 2 / kVec;
  constexpr int kPassUnits = (HEAD_DIM - ROTARY_DIM) / kVec;
  constexpr int kRotSteps = (kRotUnits + THREADS_PER_ROW - 1) / THREADS_PER_ROW;
  constexpr int kPassSteps = (kPassUnits + THREADS_PER_ROW - 1) / THREADS_PER_ROW;
  constexpr bool kRotExact = kRotUnits % THREADS_PER_ROW == 0;
  constexpr int kRowsPerCta = CTA_THREADS / THREADS_PER_ROW * ROWS_PER_THREAD;
  static_assert(kVec >= 1 && VEC_BYTES % sizeof(T) == 0, "a vector holds whole elements");
  static_assert(!INTERLEAVED || kVec % 2 == 0, "interleaved pairs must not straddle vectors");
  static_assert(INTERLEAVED ? ROTARY_DIM % kVec == 0 : ROTARY_DIM % (2 * kVec) == 0,
                "the rotated part is whole units");
  static_assert((HEAD_DIM - ROTARY_DIM) % kVec == 0, "the rest is whole vectors");
  static_assert(!VIDEO || INTERLEAVED, "video angles rotate interleaved pairs");
  static_assert(CTA_THREADS % THREADS_PER_ROW == 0, "rows must tile the CTA");
  static_assert(FORM != kRopeTokenPair || ROWS_PER_THREAD == 2, "a token pair is two rows");
  static_assert(!HALF_TABLE || !VIDEO, "video angles come from coordinates, not a table");
  static_assert(!HEAD_NORM || (!VIDEO && !INVERSE), "the head norm is a table forward's");
  static_assert(!HEAD_NORM || (THREADS_PER_ROW <= 32 && 32 % THREADS_PER_ROW == 0),
                "a normalised row's threads share a warp");
  static_assert(!DEINTERLEAVE || (!INTERLEAVED && !HEAD_NORM),
                "de-interleaving reads pairs for a half-split rotation of the raw row");
  constexpr bool kOnePlace = FORM != kRopeGeneral;  // a thread's rows share one place
  // The forward's input and the inverse's output hold a unit's kVec pairs adjacent.
  constexpr bool kAdjacentIn = DEINTERLEAVE && !INVERSE;
  constexpr bool kAdjacentOut = DEINTERLEAVE && INVERSE;

  const int lane = static_cast<int>(threadIdx.x) % THREADS_PER_ROW;
  const int slot = static_cast<int>(threadIdx.x) / THREADS_PER_ROW;
  constexpr unsigned kSlots = CTA_THREADS / THREADS_PER_ROW;  // a panel's tokens
  const unsigned heads = static_cast<unsigned>(p.heads_q + p.heads_k);
  const unsigned batch = static_cast<unsigned>(p.batch);
  const bool positions_inner = p.positions_inner != 0;
  const unsigned tokens = static_cast<unsigned>(p.tokens);
  const unsigned seq = static_cast<unsigned>(p.seq);

  VideoPairs<VIDEO ? kRotSteps : 1, VIDEO ? kVec / 2 : 1, THREADS_PER_ROW> video_pairs;

  // A thread's rows of one pass: their vectors as loaded, and where and how they are stored.
  struct Rows {
    Raw<VEC_BYTES> x[ROWS_PER_THREAD][kRotSteps][kParts];
    Raw<VEC_BYTES> rest[ROWS_PER_THREAD][kPassSteps > 0 ? kPassSteps : 1];
    T* out_row[ROWS_PER_THREAD];           // null past the last row
    bool copy_rest[ROWS_PER_THREAD];       // out of place: the unrotated columns are copied
    long long angle_key[ROWS_PER_THREAD];  // rows with equal keys share cos/sin
    long long sin_offset[ROWS_PER_THREAD];
    const T* weight[HEAD_NORM ? ROWS_PER_THREAD : 1];  // the row's norm weight (null: none)
  };

  // Where a row is: its head (q's first, then k's) and its token's batch entry and position.
  struct Place {
    unsigned head;
    unsigned entry;
    unsigned position;
    bool full_panel;  // positions inner: the row's panel holds kSlots tokens
  };
  // The batch entry and position of token `token`: positions inner, tokens run entry by entry
  // (seq positions each); heads inner, position by position (batch entries each).
  const auto set_token = [&](unsigned token, Place& place) {
    if (positions_inner) {
      place.entry = quotient(token, p.seq_divisor);
      place.position = token - place.entry * seq;
    } else {
      place.position = quotient(token, p.batch_divisor);
      place.entry = token - place.position * batch;
    }
  };
  const auto place_of = [&](long long row) {
    const unsigned r = static_cast<unsigned>(row);
    Place place{};
    // Divisions by launch constants are multiply-highs (p's magics); by kSlots, compile-time.
    if (positions_inner) {
      const unsigned panel = quotient(r / kSlots, p.heads_divisor);  // r / (kSlots * heads)
      const unsigned in_panel = r - panel * (kSlots * heads);
      const unsigned panel_tokens = min(kSlots, tokens - panel * kSlots);
      place.full_panel = panel_tokens == kSlots;
      // Only the last panel can be short of kSlots tokens.
      place.head = place.full_panel ? in_panel / kSlots : divide_rarely(in_panel, panel_tokens);
      set_token(panel * kSlots + (in_panel - place.head * panel_tokens), place);
    } else {
      const unsigned token = quotient(r, p.heads_divisor);
      place.head = r - token * heads;
      set_token(token, place);
      place.full_panel = true;
    }
    return place;
  };

  // A thread's vectors of one row whose place is known: its rotated units and, out of place,
  // its unrotated columns.
  const auto load_row_vectors = [&](int j, const T* in_row, Rows& rows) {
#pragma unroll
    for (int step = 0; step < kRotSteps; ++step) {
      const int unit = step * THREADS_PER_ROW + lane;
      if (kRotExact || step + 1 < kRotSteps || unit < kRotUnits) {
#pragma unroll
        for (int part = 0; part < kParts; ++part) {
          const int column =
              kAdjacentIn ? (2 * unit + part) * kVec : unit * kVec + part * (ROTARY_DIM / 2);
          // In place, each element is read once, by the thread that later overwrites it,
          // so the read-only path stays valid.
          rows.x[j][step][part] = load_global_nc<VEC_BYTES>(in_row + column);
        }
      }
    }
#pragma unroll
    for (int step = 0; step < kPassSteps; ++step) {
      const int unit = step * THREADS_PER_ROW + lane;
      if (rows.copy_rest[j] && unit < kPassUnits) {
        rows.rest[j][step] = load_global_nc<VEC_BYTES>(in_row + ROTARY_DIM + unit * kVec);
      }
    }
  };

  // Row j of a thread at `place`: its output row, whether it copies its unrotated columns
  // and its angle keys go into `rows`; its input row comes back with the head strides that
  // rows following it in the same token and tensor are apart (see follow).
  struct Located {
    const T* in_row;
    T* out_row;
    long long in_head_stride;
    long long out_head_stride;
  };
  // Row j, head h of q (is_q) or of k, at `place`'s token (see locate).
  const auto locate_in = [&](bool is_q, unsigned h, const Place& place, int j, Rows& rows) {
    const long long* in_strides = is_q ? p.q_strides : p.k_strides;
    const long long* out_strides = is_q ? p.q_out_strides : p.k_out_strides;
    const T* in_row = static_cast<const T*>(is_q ? p.q : p.k) + place.entry * in_strides[0] +
                      place.position * in_strides[1] + h * in_strides[2];
    T* out_row = static_cast<T*>(is_q ? p.q_out : p.k_out) + place.entry * out_strides[0] +
                 place.position * out_strides[1] + h * out_strides[2];
    rows.out_row[j] = out_row;
    // Normalised, the unrotated columns change too, so they are stored even in place.
    rows.copy_rest[j] =
        kPassUnits > 0 && (HEAD_NORM || static_cast<const void*>(out_row) != in_row);
    if constexpr (HEAD_NORM) {
      rows.weight[j] = static_cast<const T*>(is_q ? p.head_norm.q_weight : p.head_norm.k_weight);
    }
    if constexpr (VIDEO) {
      rows.angle_key[j] = place.position;
    } else {
      rows.angle_key[j] = place.entry * p.cos_strides[0] + place.position * p.cos_strides[1];
      rows.sin_offset[j] = place.entry * p.sin_strides[0] + place.position * p.sin_strides[1];
    }
    return Located{in_row, out_row, in_strides[2], out_strides[2]};
  };
  const auto locate = [&](const Place& place, int j, Rows& rows) {
    const bool is_q = place.head < static_cast<unsigned>(p.heads_q);
    return locate_in(is_q, is_q ? place.head : place.head - p.heads_q, place, j, rows);
  };
  // Row j of a thread whose row 0 is `first` (located as row 0) and whose rows are that
  // token's next heads in the same tensor: its input row.
  const auto follow = [&](int j, const Located& first, Rows& rows) {
    rows.out_row[j] = first.out_row + j * first.out_head_stride;
    rows.copy_rest[j] = rows.copy_rest[0];
    rows.angle_key[j] = rows.angle_key[0];
    rows.sin_offset[j] = rows.sin_offset[0];
    if constexpr (HEAD_NORM) rows.weight[j] = rows.weight[0];
    return first.in_row + j * first.in_head_stride;
  };

  // A thread's row j, or all its rows, cleared: none stored, none copying columns. The angle
  // keys are set too: left unset for a thread past the last rows, they cost ptxas 32 more
  // registers on the grouped prefill's 4-row config (96 -> 128).
  const auto clear_row = [](Rows& rows, int j) {
    rows.out_row[j] = nullptr;
    rows.copy_rest[j] = false;
    rows.angle_key[j] = -1;
    rows.sin_offset[j] = 0;
    if constexpr (HEAD_NORM) rows.weight[j] = nullptr;
  };
  const auto clear_rows = [&](Rows& rows) {
#pragma unroll
    for (int j = 0; j < ROWS_PER_THREAD; ++j) clear_row(rows, j);
  };

  // Issues the loads of the rows of the pass whose CTA starts at row `first`.
  const auto load_rows = [&](long long first, Rows& rows) {
    const long long row0 =
        first + static_cast<long long>(slot) * (positions_inner ? 1 : ROWS_PER_THREAD);
    const long long row_step = positions_inner ? kSlots : 1;
    // Most threads' rows are one token's consecutive heads (all but the rows that wrap into
    // the next token or lie in a short last panel): they share cos/sin and need no division,
    // and where they are all q's or all k's, their places follow from the first row's by the
    // head stride.
    Place first_place{};
    bool one_token = false;
    bool one_tensor = false;
    if (ROWS_PER_THREAD > 1 && row0 < p.rows) {
      first_place = place_of(row0);
      const unsigned last_head = first_place.head + (ROWS_PER_THREAD - 1);
      const unsigned heads_q = static_cast<unsigned>(p.heads_q);
      one_token = first_place.full_panel && last_head < heads;
      one_tensor = one_token && (last_head < heads_q || first_place.head >= heads_q);
    }
    Located first_row{};
#pragma unroll
    for (int j = 0; j < ROWS_PER_THREAD; ++j) {
      const long long row = row0 + static_cast<long long>(j) * row_step;
      clear_row(rows, j);  // a row past the last stays cleared
      const T* in_row;
      if (one_tensor && j > 0) {
        in_row = follow(j, first_row, rows);
      } else {
        if (!one_token && row >= p.rows) continue;
        Place place = first_place;
        if (one_token) {
          place.head += j;
        } else if (ROWS_PER_THREAD == 1 || j > 0) {
          place = place_of(row);
        }
        const Located at = locate(place, j, rows);
        in_row = at.in_row;
        if (j == 0) first_row = at;
      }
      load_row_vectors(j, in_row, rows);
    }
  };

  // kRopeTokenPair: issues the loads of the token of the pass whose CTA starts at row `first`,
  // its q row and its k row. With one head each, a CTA's rows in either order are its slots'
  // tokens' q and k rows (positions inner, a panel of kSlots tokens of q's head, then of k's),
  // so the thread of slot s takes token first / 2 + s. A stand-alone run of one row has no k.
  const auto load_pair = [&](long long first, Rows& rows) {
    clear_rows(rows);
    const long long token = first / 2 + slot;
    if (2 * token >= p.rows) return;
    Place place{0u, 0u, 0u, true};
    set_token(static_cast<unsigned>(token), place);
    load_row_vectors(0, locate_in(true, 0u, place, 0, rows).in_row, rows);
    if (p.heads_k != 0) load_row_vectors(1, locate_in(false, 0u, place, 1, rows).in_row, rows);
  };

  // kRopeGrouped: issues the loads of the group of the pass whose CTA starts at row `first`. A
  // thread's group is an item. Heads inner, items are (token, group) pairs, groups inner: item
  // i holds rows i * ROWS_PER_THREAD on, in the row order above. Positions inner, they come
  // in panels of p.panel_tokens tokens x all groups, group-major, tokens inner, so
  // neighbouring slots read neighbouring positions of one head, the CTAs in flight stream a
  // few heads at a time, and every group of a panel reads its cos/sin rows within a few MB of
  // traffic, while L2 holds them. (All of a group's tokens before the next group's read the
  // Llama table of 8 x 2048 positions, 8 MB, from DRAM once per group: 1.18x the time of a
  // negation of the same bytes against 1.06x. Panels of one CTA's tokens had every head in
  // flight at once: the 86 MB prefill 1.08x against 1.07x.)
  const auto load_group = [&](long long first, Rows& rows) {
    clear_rows(rows);  // a group past the last is marked by its first row's output
    // A CTA's first row is a multiple of kRowsPerCta, so of ROWS_PER_THREAD.
    const long long item = first / ROWS_PER_THREAD + slot;
    if (item >= p.rows / ROWS_PER_THREAD) return;
    const unsigned i = static_cast<unsigned>(item);
    Place place{0u, 0u, 0u, true};
    if (positions_inner) {
      // i / (panel_tokens * groups), as (i / panel_tokens) * ROWS_PER_THREAD / heads.
      const unsigned panel =
          quotient(quotient(i, p.panel_divisor) * ROWS_PER_THREAD, p.heads_divisor);
      const unsigned panel_first = panel * static_cast<unsigned>(p.panel_tokens);
      const unsigned in_panel = i - panel_first * (heads / ROWS_PER_THREAD);
      const bool last = panel_first + static_cast<unsigned>(p.panel_tokens) > tokens;
      const unsigned width = static_cast<unsigned>(last ? p.last_panel_tokens : p.panel_tokens);
      const unsigned group = quotient(in_panel, last ? p.last_panel_divisor : p.panel_divisor);
      place.head = group * ROWS_PER_THREAD;
      set_token(panel_first + (in_panel - group * width), place);
    } else {
      const unsigned row = i * ROWS_PER_THREAD;
      const unsigned token = quotient(row, p.heads_divisor);
      place.head = row - token * heads;
      set_token(token, place);
    }
    const Located first_row = locate(place, 0, rows);
    load_row_vectors(0, first_row.in_row, rows);
#pragma unroll
    for (int j = 1; j < ROWS_PER_THREAD; ++j) load_row_vectors(j, follow(j, first_row, rows), rows);
  };

  // HEAD_NORM: each row's rsqrt(mean(x^2) + eps), its sum of squares met across the row's
  // threads by shuffles (every thread of the warp takes part, rows past the last with 0).
  const auto head_scales = [&](const Rows& rows, float(&scale)[HEAD_NORM ? ROWS_PER_THREAD : 1]) {
#pragma unroll
    for (int j = 0; j < (HEAD_NORM ? ROWS_PER_THREAD : 0); ++j) {
      float squares = 0.0f;
      if (rows.out_row[j] != nullptr) {
#pragma unroll
        for (int step = 0; step < kRotSteps; ++step) {
          const int unit = step * THREADS_PER_ROW + lane;
          if (!(kRotExact || step + 1 < kRotSteps || unit < kRotUnits)) continue;
#pragma unroll
          for (int part = 0; part < kParts; ++part) {
#pragma unroll
            for (int i = 0; i < kVec; ++i) {
              const float e = get_element<T>(rows.x[j][step][part], i);
              squares += e * e;
            }
          }
        }
#pragma unroll
        for (int step = 0; step < kPassSteps; ++step) {
          const int unit = step * THREADS_PER_ROW + lane;
          if (unit >= kPassUnits) continue;
#pragma unroll
          for (int i = 0; i < kVec; ++i) {
            const float e = get_element<T>(rows.rest[j][step], i);
            squares += e * e;
          }
        }
      }
#pragma unroll
      for (int offset = THREADS_PER_ROW / 2; offset > 0; offset /= 2) {
        squares += __shfl_xor_sync(0xffffffffu, squares, offset);
      }
      scale[j] = rsqrtf(squares * (1.0f / HEAD_DIM) + p.head_norm.eps);
    }
  };
  // A thread's vector of a row (columns from `column`) normalised with the row's scale and
  // weight, and rounded to T as the separate norm's output is.
  const auto normalise = [](float(&v)[kVec], const T* weight, int column, float scale) {
    float w[kVec];
    if (weight != nullptr) {
      load_floats_nc<T, VEC_BYTES>(weight + column, w);
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) w[i] = 1.0f;
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = v[i] * scale * w[i];
#pragma unroll
    for (int i = 0; i + 1 < kVec; i += 2) round_through<T>(v[i], v[i + 1]);
    if constexpr (kVec % 2 != 0) v[kVec - 1] = to_float(from_float<T>(v[kVec - 1]));
  };

  // Whether row j's cos/sin differ from the row's before it (rows of one place share them).
  const auto new_angles = [](const Rows& rows, int j) {
    return j == 0 || (!kOnePlace && rows.angle_key[j] != rows.angle_key[j - 1]);
  };

  // Rotates and stores the loaded rows, a step at a time, so a thread holds one step's
  // cos/sin, shared by its consecutive rows with equal angle keys.
  const auto rotate_rows = [&](const Rows& rows) {
    float scale[HEAD_NORM ? ROWS_PER_THREAD : 1];
    if constexpr (HEAD_NORM) head_scales(rows, scale);
    float axes[ROWS_PER_THREAD][3];
    if constexpr (VIDEO) {
#pragma unroll
      for (int j = 0; j < ROWS_PER_THREAD; ++j) {
        if (rows.out_row[j] != nullptr && new_angles(rows, j)) {
          video_pairs.rotate_axes(p.video, static_cast<unsigned>(rows.angle_key[j]), axes[j]);
        }
      }
    }
#pragma unroll
    for (int step = 0; step < kRotSteps; ++step) {
      const int unit = step * THREADS_PER_ROW + lane;
      if (!(kRotExact || step + 1 < kRotSteps || unit < kRotUnits)) continue;
      float c[kUnitWidth];
      float s[kUnitWidth];
#pragma unroll
      for (int j = 0; j < ROWS_PER_THREAD; ++j) {
        if (rows.out_row[FORM == kRopeGrouped ? 0 : j] == nullptr) continue;
        if (new_angles(rows, j)) {
          if constexpr (VIDEO) {
#pragma unroll
            for (int i = 0; i < kVec / 2; ++i) {
              video_pairs.cos_sin(step, i, axes[j], c[2 * i], s[2 * i]);
              c[2 * i + 1] = c[2 * i];
              s[2 * i + 1] = s[2 * i];
            }
          } else {
            const TABLE* cos_row = static_cast<const TABLE*>(p.cos) + rows.angle_key[j];
            const TABLE* sin_row = static_cast<const TABLE*>(p.sin) + rows.sin_offset[j];
            if constexpr (HALF_TABLE && INTERLEAVED) {
              // Pair i of the unit takes angle column unit * kVec / 2 + i, for both elements.
              float half_c[kVec / 2];
              float half_s[kVec / 2];
              load_table<TABLE, kVec / 2, VEC_BYTES / 2>(cos_row + unit * (kVec / 2), half_c);
              load_table<TABLE, kVec / 2, VEC_BYTES / 2>(sin_row + unit * (kVec / 2), half_s);
#pragma unroll
              for (int i = 0; i < kVec; ++i) {
                c[i] = half_c[i / 2];
                s[i] = half_s[i / 2];
              }
            } else if constexpr (HALF_TABLE) {
              // Both halves of a unit take the angles of its first half's columns.
              load_table<TABLE, kVec, VEC_BYTES>(cos_row + unit * kVec, c);
              load_table<TABLE, kVec, VEC_BYTES>(sin_row + unit * kVec, s);
#pragma unroll
              for (int i = 0; i < kVec; ++i) {
                c[kVec + i] = c[i];
                s[kVec + i] = s[i];
              }
            } else {
#pragma unroll
              for (int part = 0; part < kParts; ++part) {
                const int column = unit * kVec + part * (ROTARY_DIM / 2);
                load_table<TABLE, kVec, VEC_BYTES>(cos_row + column, c + part * kVec);
                load_table<TABLE, kVec, VEC_BYTES>(sin_row + column, s + part * kVec);
              }
            }
          }
        }
        // Normalised, a thread's elements are unpacked and scaled first; else each is read
        // from its vector where the rotation uses it.
        float x[HEAD_NORM ? kParts : 1][HEAD_NORM ? kVec : 1];
        if constexpr (HEAD_NORM) {
#pragma unroll
          for (int part = 0; part < kParts; ++part) {
#pragma unroll
            for (int i = 0; i < kVec; ++i) x[part][i] = get_element<T>(rows.x[j][step][part], i);
            normalise(x[part], rows.weight[j], unit * kVec + part * (ROTARY_DIM / 2), scale[j]);
          }
        }
        const auto element = [&](int part, int i) {
          if constexpr (HEAD_NORM) {
            return x[part][i];
          } else {
            return get_element<T>(rows.x[j][step][part], i);
          }
        };
        if constexpr (INTERLEAVED) {
          float result[kVec];
#pragma unroll
          for (int i = 0; i < kVec; i += 2) {
            const float re = element(0, i);
            const float im = element(0, i + 1);
            if constexpr (INVERSE) {
              result[i] = re * c[i] + im * s[i + 1];
              result[i + 1] = im * c[i + 1] - re * s[i];
            } else {
              result[i] = re * c[i] - im * s[i];
              result[i + 1] = im * c[i + 1] + re * s[i + 1];
            }
          }
          store_floats<T, VEC_BYTES>(rows.out_row[j] + unit * kVec, result);
        } else {
          float first_half[kVec];
          float second_half[kVec];
#pragma unroll
          for (int i = 0; i < kVec; ++i) {
            // De-interleaving, pair i is elements 2i and 2i + 1 of the unit's two vectors.
            const float a = kAdjacentIn ? element(2 * i / kVec, 2 * i % kVec) : element(0, i);
            const float b = kAdjacentIn ? element((2 * i + 1) / kVec, (2 * i + 1) % kVec)
                                        : element(kParts - 1, i);
            if constexpr (INVERSE) {
              first_half[i] = a * c[i] + b * s[kVec + i];
              second_half[i] = b * c[kVec + i] - a * s[i];
            } else {
              first_half[i] = a * c[i] - b * s[i];
              second_half[i] = b * c[kVec + i] + a * s[kVec + i];
            }
          }
          if constexpr (kAdjacentOut) {
            float adjacent[2][kVec];
#pragma unroll
            for (int i = 0; i < kVec; ++i) {
              adjacent[2 * i / kVec][2 * i % kVec] = first_half[i];
              adjacent[(2 * i + 1) / kVec][(2 * i + 1) % kVec] = second_half[i];
            }
            store_floats<T, VEC_BYTES>(rows.out_row[j] + 2 * unit * kVec, adjacent[0]);
            store_floats<T, VEC_BYTES>(rows.out_row[j] + (2 * unit + 1) * kVec, adjacent[1]);
          } else {
            store_floats<T, VEC_BYTES>(rows.out_row[j] + unit * kVec, first_half);
            store_floats<T, VEC_BYTES>(rows.out_row[j] + unit * kVec + ROTARY_DIM / 2, second_half);
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < ROWS_PER_THREAD; ++j) {
#pragma unroll
      for (int step = 0; step < kPassSteps; ++step) {
        const int unit = step * THREADS_PER_ROW + lane;
        if (rows.copy_rest[j] && unit < kPassUnits) {
          if constexpr (HEAD_NORM) {
            float rest[kVec];
#pragma unroll
            for (int i = 0; i < kVec; ++i) rest[i] = get_element<T>(rows.rest[j][step], i);
            normalise(rest, rows.weight[j], ROTARY_DIM + unit * kVec, scale[j]);
            store_floats<T, VEC_BYTES>(rows.out_row[j] + ROTARY_DIM + unit * kVec, rest);
          } else {
            store_global<VEC_BYTES>(rows.out_row[j] + ROTARY_DIM + unit * kVec, rows.rest[j][step]);
          }
        }
      }
    }
  };

  const long long grid_rows = static_cast<long long>(gridDim.x) * kRowsPerCta;
  Rows current;
  const auto load = [&](long long first, Rows& rows) {
    if constexpr (FORM == kRopeGrouped) {
      load_group(first, rows);
    } else if constexpr (FORM == kRopeTokenPair) {
      load_pair(first, rows);
    } else {
      load_rows(first, rows);
    }
  };
  long long first = static_cast<long long>(blockIdx.x) * kRowsPerCta;
  if (first >= p.rows) return;
  // The first pass's loads go out before the video frequencies are computed, so a CTA spends
  // its setup waiting on memory, not before asking it.
  load(first, current);
  if constexpr (VIDEO) video_pairs.init(p.video, lane);
  if constexpr (PREFETCH) {
    for (; first < p.rows; first += grid_rows) {
      Rows next;
      load(first + grid_rows, next);
      rotate_rows(current);
      current = next;
    }
  } else {
    // One pass: without a persistent grid the host launches a covering grid, which rows
    // below 2^31 (the host checks) never outgrow.
    rotate_rows(current);
  }
}

}  // namespace kiln
