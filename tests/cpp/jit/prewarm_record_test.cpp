// A prewarm record's row ranges: which buckets get a config of their own, which config a
// call of a bucket is served, and what an import accepts. No GPU, no NVRTC.
#include <doctest/doctest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "jit/prewarm.h"
#include "jit/tuning_bundle.h"
#include "jit_test_support.h"
#include "templates/norm_family.h"
#include "templates/rms_norm_family.h"

namespace kiln::jit {
namespace {

using nlohmann::json;

const Problem kLlamaNorm{Op::rms_norm, DType::bf16, 4096, kRmsNormHasWeight, 16};

// The record `kiln prewarm` writes for `problem`, with placeholder binary keys and no versions.
json record_for(const Problem& problem, int sm) {
  const Family& fam = family(problem.op);
  const DeviceTraits traits = DeviceTraits::for_arch(sm);
  json record = {{"source", "prewarm"},
                 {"problem", problem},
                 {"arch", "sm_" + std::to_string(sm)},
                 {"winner", fam.heuristic(problem, traits)}};
  for (const auto& [up_to_rows, config] : prewarm_row_configs(fam, problem, traits)) {
    record["by_rows"].push_back(
        {{"up_to_rows", up_to_rows}, {"winner", config}, {"binary_key", "0123456789abcdef"}});
  }
  return record;
}

}  // namespace

TEST_CASE("prewarm ranges: the norms' latency config up to one row per SM of the arch") {
  const Family& fam = family(Op::rms_norm);
  for (const auto& [sm, last_bucket] : {std::pair{90, 128}, {80, 64}, {75, 32}}) {
    CAPTURE(sm);
    const DeviceTraits traits = DeviceTraits::for_arch(sm);
    const auto ranges = prewarm_row_configs(fam, kLlamaNorm, traits);
    REQUIRE(ranges.size() == 1);
    CHECK(ranges.front().first == last_bucket);
    CHECK(ranges.front().second == fam.heuristic_for_rows(kLlamaNorm, traits, 1));
    CHECK_FALSE(ranges.front().second == fam.heuristic(kLlamaNorm, traits));
  }
  // A family whose heuristic does not depend on rows has no ranges.
  const Problem swiglu{Op::swiglu, DType::bf16, 14336, 0, 16};
  CHECK(prewarm_row_configs(family(Op::swiglu), swiglu, DeviceTraits::for_arch(90)).empty());
}

TEST_CASE("prewarm record: a call's bucket picks its range, past the ranges the winner") {
  const Family& fam = family(Op::rms_norm);
  const DeviceTraits h200 = DeviceTraits::for_arch(90);
  const json record = record_for(kLlamaNorm, 90);
  std::string why;
  for (std::int64_t bucket : {1, 2, 64, 128}) {
    CAPTURE(bucket);
    CHECK(usable_prewarm_config(record, fam, kLlamaNorm, h200, bucket, why) ==
          fam.heuristic_for_rows(kLlamaNorm, h200, bucket));
  }
  for (std::int64_t bucket : {256, 4096, 65536}) {
    CAPTURE(bucket);
    CHECK(usable_prewarm_config(record, fam, kLlamaNorm, h200, bucket, why) ==
          fam.heuristic(kLlamaNorm, h200));
  }
  // A record written before ranges existed serves its winner at every bucket.
  json old = record;
  old.erase("by_rows");
  CHECK(usable_prewarm_config(old, fam, kLlamaNorm, h200, 1, why) ==
        fam.heuristic(kLlamaNorm, h200));
}

TEST_CASE("prewarm record: an unreadable one is not used; an invalid range gives way") {
  const Family& fam = family(Op::rms_norm);
  const DeviceTraits h200 = DeviceTraits::for_arch(90);
  json record = record_for(kLlamaNorm, 90);
  std::string why;
  json torn = record;
  torn["by_rows"][0].erase("up_to_rows");
  CHECK_FALSE(usable_prewarm_config(torn, fam, kLlamaNorm, h200, 1, why));
  CHECK(test::contains(why, "unreadable record"));
  // A range whose config the family no longer takes: its winner, whose binary is there too.
  json invalid = record;
  invalid["by_rows"][0]["winner"]["threads_per_row"] = 3;
  CHECK(usable_prewarm_config(invalid, fam, kLlamaNorm, h200, 1, why) ==
        fam.heuristic(kLlamaNorm, h200));
  json none_valid = invalid;
  none_valid["winner"]["threads_per_row"] = 3;
  CHECK_FALSE(usable_prewarm_config(none_valid, fam, kLlamaNorm, h200, 1, why));
  CHECK(test::contains(why, "no longer valid"));
}

TEST_CASE("prewarm record: a GPU with another SM count gets its own heuristic where compiled") {
  const Family& fam = family(Op::rms_norm);
  const json record = record_for(kLlamaNorm, 90);  // ranges drawn for 132 SMs
  std::string why;
  DeviceTraits pcie = DeviceTraits::for_arch(90);
  pcie.sm_count = 114;  // an H100 PCIe: 128 rows are more than one wave of single rows
  CHECK(usable_prewarm_config(record, fam, kLlamaNorm, pcie, 128, why) ==
        fam.heuristic(kLlamaNorm, pcie));
  CHECK(usable_prewarm_config(record, fam, kLlamaNorm, pcie, 64, why) ==
        fam.heuristic_for_rows(kLlamaNorm, pcie, 64));
  DeviceTraits larger = DeviceTraits::for_arch(90);
  larger.sm_count = 300;  // its own heuristic for 256 rows is the latency config, compiled
  CHECK(usable_prewarm_config(record, fam, kLlamaNorm, larger, 256, why) ==
        fam.heuristic_for_rows(kLlamaNorm, larger, 256));
  CHECK_FALSE(fam.heuristic_for_rows(kLlamaNorm, larger, 256) == fam.heuristic(kLlamaNorm, larger));
}

TEST_CASE("prewarm record: an import checks the ranges") {
  json entry = {{"device", "prewarm-sm_90"},
                {"problem", kLlamaNorm.key()},
                {"bucket", kPrewarmBucket},
                {"document", record_for(kLlamaNorm, 90)}};
  CHECK(invalid_entry_reason(entry) == "");
  json repeated = entry;
  repeated["document"]["by_rows"].push_back(repeated["document"]["by_rows"][0]);
  CHECK(
      test::contains(invalid_entry_reason(repeated), "by_rows: expected ranges of rows ascending"));
  json torn = entry;
  torn["document"]["by_rows"][0].erase("winner");
  CHECK(invalid_entry_reason(torn) != "");
  json keyless = entry;
  keyless["document"]["by_rows"][0].erase("binary_key");
  CHECK(invalid_entry_reason(keyless) != "");
  json not_a_list = entry;
  not_a_list["document"]["by_rows"] = not_a_list["document"]["by_rows"][0];
  CHECK(test::contains(invalid_entry_reason(not_a_list), "by_rows: expected an array"));
}

}  // namespace kiln::jit
