// An op family: everything kiln knows about one kernel template, with no CUDA in it.
// The tuner enumerates and prunes its space, jit/ compiles its name expression and
// launches with its geometry, the bindings fill its parameter struct.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "templates/types.h"

namespace kiln {

// What a prewarm knows of a model beyond the size an op runs at: its attention head counts
// (for a family whose kernels specialise on them) and whether it trains (for a family whose
// backward is a form of its own op rather than an op of its own).
struct PrewarmModel {
  std::int64_t heads_q = 4;  // fours when unknown, as most models' counts divide by
  std::int64_t heads_k = 4;
  bool training = false;
  // Its attentions RMS-normalise each head of q and k and rotate them in one head_norm_rope
  // call, as kiln's patch runs them without autograd: the call's layout flags (FLUX's:
  // interleaved, an fp32 table; Qwen3's and Gemma 3's: halves, a table of the model's dtype,
  // q and k as the attention hands them over).
  std::optional<std::uint32_t> head_norm_layout = std::nullopt;
  // The columns of each head its RoPE rotates (Problem::aux of RoPE's problems): 0 for all,
  // fewer where the model rotates part of the head (partial_rotary_factor).
  std::int64_t rotary_dim = 0;
  // RoPE's flags for each table form its attentions hand over: transformers' usual [.., D] one
  // of the model's dtype (0), GPT-OSS's half table, GLM's interleaved pairs, DeepSeek's pairs
  // de-interleaved; several where the config leaves the choice to the model's code.
  std::vector<std::uint32_t> rope_tables = {0u};
  // rms_norm_gated's flags for the model's gated norm where it is not the linear attention's
  // (the weight, silu of the gate after the norm): Mamba-2's, the gate first.
  std::optional<std::uint32_t> gated_norm_flags = std::nullopt;
  // adaln's and gated_adaln's flags as its patched DiT blocks call them (the norm, where the
  // modulation comes from, how it broadcasts, the tables' dtype); the families' list where not
  // given.
  std::optional<std::vector<std::uint32_t>> modulation_flags = std::nullopt;
  // The head dim of its rms_norm_rope calls' half tables (Problem::aux: Wan hands over one
  // angle a rotation pair); 0 where it calls with full-row tables or coordinates.
  std::int64_t rms_norm_rope_half_table = 0;
  // Ops it runs in fp32 whatever the dtype prewarmed (Wan's FP32LayerNorm output norm).
  std::vector<Op> fp32_ops;
};

// A scratch buffer the evaluator must provide to run a candidate on its own.
struct BufferSpec {
  std::string name;
  DType dtype;
  std::int64_t elements;
  bool is_output;
  // How many terms each element of an output adds up. Candidates that add them in another
  // order round differently, by an amount that grows with the count, so the evaluator's check
  // widens its allowance for near-zero sums to match (jit/verify.h, compare_outputs).
  std::int64_t summed_terms = 1;
};

class Family {
 public:
  virtual ~Family() = default;

  virtual Op op() const = 0;
  std::string_view name() const { return op_name(op()); }
  // The embedded header that defines the kernel template, e.g. "kiln/norm.cuh".
  virtual std::string_view header() const = 0;

  // Throws ArgumentError if the problem cannot be specialised at all (hidden <= 0, ...).
  virtual void check(const Problem& problem) const = 0;
  // Every valid config for the problem on the target, in a fixed canonical order
  // (the order ties are broken in).
  virtual std::vector<Config> space(const Problem& problem, const DeviceTraits& device) const = 0;
  // Why `config` is invalid for the problem on the target; empty when it is valid.
  virtual std::string invalid_reason(const Problem& problem, const Config& config,
                                     const DeviceTraits& device) const = 0;
  // A good config without measuring, for calls of any row count: what a prewarm record
  // serves past its row buckets (jit/prewarm.h) and what a compile without rows uses.
  virtual Config heuristic(const Problem& problem, const DeviceTraits& device) const = 0;
  // A good config without measuring for calls of `rows` rows (a row bucket): what
  // KILN_TUNE=off and a graph capture use, where a fast search starts, and the reference every
  // tuned candidate must agree with. The heuristic by default; a family whose best layout
  // differs by row count (a few rows are latency-bound, many are bandwidth-bound) answers
  // nearer to it. The result must be in space().
  virtual Config heuristic_for_rows(const Problem& problem, const DeviceTraits& device,
                                    std::int64_t /*rows*/) const {
    return heuristic(problem, device);
  }

  // The kernel's C++ name expression, e.g. "kiln::norm<kiln::bf16, 4096, 16, 32, 128, 2u, false>".
  virtual std::string name_expression(const Problem& problem, const Config& config) const = 0;
  // Grid, block and dynamic shared memory for `rows` rows.
  virtual LaunchGeometry geometry(const Problem& problem, const Config& config,
                                  std::int64_t rows) const = 0;

  // For running a candidate in isolation (the evaluator): the buffers to allocate, in the
  // order their device addresses are passed to pack_params, and the bytes of the kernel's
  // single by-value parameter struct for those addresses.
  virtual std::vector<BufferSpec> buffers(const Problem& problem, std::int64_t rows) const = 0;
  virtual std::vector<std::byte> pack_params(const Problem& problem, std::int64_t rows,
                                             std::span<const std::uint64_t> addresses) const = 0;
  // Bytes that must move for `rows` rows (inputs read once, outputs written once).
  virtual std::int64_t bytes_moved(const Problem& problem, std::int64_t rows) const = 0;

  // Whether a fast search tuning for `rows` rows should measure `config` (a full search
  // measures every config): the family's rule for variants that only pay at some row
  // counts, so that they take no place from plausible candidates elsewhere. All by default.
  virtual bool worth_measuring(const Problem& /*problem*/, const Config& /*config*/,
                               const DeviceTraits& /*device*/, std::int64_t /*rows*/) const {
    return true;
  }

  // Extras that, set to 1 alone, keep a row somewhere other than a thread's registers (read
  // twice, or staged in shared memory). Such a form frees registers, so its best split is
  // seldom the held row's, and the fast search's second round tries each at the winner's
  // diagonal neighbours. None by default.
  virtual std::span<const std::string_view> row_forms() const { return {}; }

  // The specialisations models with this hidden size typically ask for, for `model` (what
  // `kiln prewarm` compiles for the op), as aligned as the model's calls are: 16 bytes unless
  // their rows are not whole 16-byte multiples (config_rules.h's row_alignment).
  virtual std::vector<Problem> common_problems(DType dtype, std::int64_t hidden,
                                               const PrewarmModel& /*model*/) const {
    Problem problem;
    problem.op = op();
    problem.dtype = dtype;
    problem.hidden = hidden;
    return {problem};
  }
};

// The registry of families, by op.
const Family& family(Op op);
std::span<const Family* const> families();

// The embedded template sources: name ("kiln/norm.cuh") -> text. Built into the library
// from templates/kiln/*.cuh at build time, so an installed kiln needs no source tree.
struct EmbeddedSource {
  std::string_view name;
  std::string_view text;
};
std::span<const EmbeddedSource> embedded_sources();

}  // namespace kiln
