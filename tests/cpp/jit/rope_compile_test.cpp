#include <doctest/doctest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "jit/compiler.h"
#include "templates/family.h"
#include "templates/rms_norm_rope_family.h"
#include "templates/rope_family.h"
#include "tuner/tuner.h"

namespace kiln::jit {

// What a fast tune compiles, compiled as the evaluator does (worker threads, no GPU needed).
TEST_CASE("every fast-tune candidate of the RoPE families compiles for sm_75, sm_80 and sm_90") {
  const Problem problems[] = {
      Problem{Op::rope, DType::bf16, 128, 0u, 16},
      Problem{Op::rope, DType::f16, 128, kRopeInterleaved | kRopeTableF32, 16},
      // Head counts in fours: every config's rows grouped.
      Problem{Op::rope, DType::bf16, 128, kRopePositionsInner | rope_head_flags(32, 8), 16},
      // Half tables (one angle a pair): GPT-OSS's half-split, and interleaved from fp32 (on
      // sm_90 only, with the other plain heads).
      Problem{Op::rope, DType::bf16, 64, kRopeHalfTable | rope_head_flags(64, 8), 16},
      Problem{Op::rope, DType::f16, 128, kRopeHalfTable | kRopeInterleaved | kRopeTableF32, 16},
      // Each head normalised first (head_norm_rope): Qwen3's heads, FLUX's interleaved fp32
      // table, and a partial rotary dim in fp32 positions inner.
      Problem{Op::rope, DType::bf16, 128, kRopeHeadNorm | rope_head_flags(32, 8), 16},
      Problem{Op::rope, DType::f16, 128,
              kRopeHeadNorm | kRopeInterleaved | kRopeTableF32 | rope_head_flags(24, 24), 16},
      Problem{Op::rope, DType::f32, 128, kRopeHeadNorm | kRopePositionsInner, 16, 64},
      // DeepSeek-V3's MLA RoPE (pairs de-interleaved, half table) and its backward; heads in
      // fours so the older archs compile it too.
      Problem{Op::rope, DType::bf16, 64, kRopeDeinterleave | kRopeHalfTable, 16},
      Problem{Op::rope, DType::f16, 64,
              kRopeDeinterleave | kRopeInverse | kRopeTableF32 | rope_head_flags(16, 4), 16},
      // Halves that are not whole 16-byte vectors: Qwen3-VL's 72-wide heads from an fp32 table
      // (8-byte pairs) and MiniMax-M3-VL's 78 of 80 from a bf16 table of 4-byte rows (2-byte
      // pairs).
      Problem{Op::rope, DType::bf16, 72, kRopeTableF32 | rope_head_flags(16, 16), 16},
      Problem{Op::rope, DType::bf16, 80, rope_head_flags(16, 16), 4, 78},
      Problem{Op::rope_3d, DType::bf16, 2048, 0u, 16},
      Problem{Op::rms_norm_rope, DType::bf16, 2048, kRmsNormRopeVideo, 16},
      // Wan's prologue: 40 heads of 128 normalised across heads, each head's pairs from an fp32
      // table of 64 angles; and a head dim of 12 (vectors of 4 bf16) from a bf16 table.
      Problem{Op::rms_norm_rope, DType::bf16, 5120, kRmsNormRopeTableF32, 16, 128},
      Problem{Op::rms_norm_rope, DType::bf16, 72, 0u, 16, 12},
  };
  std::vector<CompileRequest> requests;
  for (int sm : {75, 80, 90}) {
    for (const Problem& p : problems) {
      // The older archs: the video angles (rms_norm_rope's parked in shared memory across its
      // barrier) and the grouped rows.
      if (sm != 90 && p.op == Op::rope && (p.flags & kRopeHeadsBy4) == 0) {
        continue;
      }
      const DeviceTraits traits = DeviceTraits::for_arch(sm);
      for (const Config& c : candidates(family(p.op), p, traits, TuneMode::fast, 8, 32768)) {
        requests.push_back({&family(p.op), p, c, sm, BinaryFormat::cubin});
      }
    }
  }
  REQUIRE(requests.size() >= 20);
  std::atomic<std::size_t> next{0}, failures{0};
  std::vector<std::string> errors(requests.size());
  auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < requests.size();) {
      const auto compiled = compile(requests[i], nullptr);
      if (!compiled) {
        errors[i] = compiled.error().message() + "\n" + compiled.error().log();
        ++failures;
      }
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(2);
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back(work);
  }
  for (auto& t : threads) {
    t.join();
  }
  for (const auto& e : errors) {
    if (!e.empty()) {
      MESSAGE(e);
    }
  }
  CHECK(failures == 0);
}

}  // namespace kiln::jit
