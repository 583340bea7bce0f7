// A small, realistic tuning database for the report tests: two devices (one with a recorded
// copy bandwidth, one without), a tuned RMSNorm with failures of several classes, a SwiGLU,
// a mode-off result, a prewarm record and a damaged file.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tuner/report.h"
#include "tuner/tuner.h"

namespace kiln::testing {

inline Trial trial(Config config, TrialStatus status, double median_us, double spread_us,
                   double compile_ms, std::string message = {}) {
  Trial t;
  t.config = std::move(config);
  t.status = status;
  t.median_us = median_us;
  t.spread_us = spread_us;
  t.compile_ms = compile_ms;
  t.repetitions = status == TrialStatus::ok ? 50 : 0;
  t.message = std::move(message);
  return t;
}

inline Problem rms_norm_problem() {
  return Problem{Op::rms_norm, DType::bf16, 4096, 1, 16};
}
inline Problem swiglu_problem() {
  return Problem{Op::swiglu, DType::bf16, 4096, 0, 16};
}

// Stored like jit::tuning_document writes it, plus `copy_gbs` when positive.
inline nlohmann::json stored(const TuneResult& result, const std::string& name,
                             const std::string& fingerprint, int sm_count, double copy_gbs) {
  nlohmann::json document = result;
  document["versions"] = {{"kiln", "0.1.0"}, {"nvrtc", "12.8"}, {"driver", "13.0"}};
  document["device"] = {
      {"name", name},           {"fingerprint", fingerprint}, {"sm", 90},
      {"sm_count", sm_count},   {"memory_bytes", 1},          {"l2_bytes", 52428800},
      {"bandwidth_gbs", 3352.3}};
  if (copy_gbs > 0) document["device"]["copy_bandwidth_gbs"] = copy_gbs;
  return document;
}

inline const Config kHeuristic{16, 32, 128, {}};
inline const Config kWinner{16, 64, 256, {}};

inline TuneResult rms_norm_result() {
  TuneResult r;
  r.problem = rms_norm_problem();
  r.bucket_rows = 4096;
  r.mode = TuneMode::full;
  r.heuristic = kHeuristic;
  r.winner = kWinner;
  r.trials = {
      trial(kHeuristic, TrialStatus::ok, 40.0, 0.4, 120),
      trial(kWinner, TrialStatus::ok, 32.0, 0.2, 130),
      trial(Config{8, 32, 128, {}}, TrialStatus::ok, 50.0, 1.0, 0),
      trial(Config{16, 1024, 1024, {}}, TrialStatus::resource_error, NAN, NAN, 90,
            "too many registers | <spill>"),
      trial(Config{4, 32, 128, {}}, TrialStatus::wrong_result, NAN, NAN, 80, "max error 0.25")};
  r.tune_ms = 900;
  r.reason = "fastest ok candidate";
  return r;
}

inline TuneResult swiglu_result() {
  TuneResult r;
  r.problem = swiglu_problem();
  r.bucket_rows = 1024;
  r.rows = 1000;  // the call that missed had 1000 rows
  r.mode = TuneMode::fast;
  r.heuristic = kHeuristic;
  r.winner = kHeuristic;
  r.trials = {trial(kHeuristic, TrialStatus::ok, 20.0, 0.1, 100),
              trial(kWinner, TrialStatus::ok, 20.2, 0.1, 100)};
  r.tune_ms = 300;
  r.reason = "within 2% of the fastest and earlier";
  return r;
}

inline TuneResult mode_off_result() {
  TuneResult r;
  r.problem = rms_norm_problem();
  r.bucket_rows = 1;
  r.mode = TuneMode::off;
  r.heuristic = kHeuristic;
  r.winner = kHeuristic;
  r.tune_ms = 0;
  r.reason = "tuning off";
  return r;
}

inline std::vector<report::StoredDocument> fixture_documents() {
  const std::string h100 = "NVIDIA_H100_80GB_HBM3.sm90.132sm.80GiB";
  const std::string h200 = "NVIDIA_H200.sm90.132sm.141GiB";
  std::vector<report::StoredDocument> docs;
  auto add = [&](const std::string& device, const TuneResult& r, const std::string& name,
                 double copy) {
    docs.push_back({device, r.problem.key(), r.bucket_rows, stored(r, name, device, 132, copy)});
  };
  add(h100, rms_norm_result(), "NVIDIA H100 80GB HBM3", 3000.0);
  add(h100, swiglu_result(), "NVIDIA H100 80GB HBM3", 3000.0);
  add(h200, rms_norm_result(), "NVIDIA H200", 0);
  add(h200, mode_off_result(), "NVIDIA H200", 0);
  docs.push_back({"prewarm-sm_90", rms_norm_problem().key(), 0,
                  nlohmann::json{{"source", "prewarm"},
                                 {"problem", rms_norm_problem()},
                                 {"arch", "sm_90"},
                                 {"winner", kHeuristic}}});
  docs.push_back(
      {h200, "swiglu.bf16.h4096.f0.a16", 64, nlohmann::json(nlohmann::json::value_t::discarded)});
  return docs;
}

}  // namespace kiln::testing
