// Every kiln kernel may be launched programmatically on sm_90 (jit/launch.h): its CTAs can run
// before the kernel ahead of it has finished, so each must wait for prior grids before its
// first global memory access. Checked in the PTX of every family's kernels (the heuristic and
// one config of each extra tunable), with no GPU; before sm_90 the kernels carry neither
// instruction.
#include <doctest/doctest.h>

#include <atomic>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "jit/compiler.h"
#include "templates/family.h"

namespace kiln::jit {
namespace {

// The instruction lines of `entry`'s body in `ptx`, predicates stripped.
std::vector<std::string> entry_instructions(const std::string& ptx, const std::string& entry) {
  std::vector<std::string> lines;
  const std::size_t start = ptx.find(".entry " + entry + "(");
  if (start == std::string::npos) {
    return lines;
  }
  std::istringstream body(ptx.substr(start));
  std::string line;
  while (std::getline(body, line)) {
    const std::size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos) {
      continue;
    }
    line = line.substr(first);
    if (line.starts_with("@")) {
      line = line.substr(line.find_first_of(" \t") + 1);
    }
    lines.push_back(line);
  }
  return lines;
}

// Whether an instruction may touch global memory: a load, store, atomic, reduction, async
// copy or prefetch whose state space is global, or not named (a generic address).
bool touches_global_memory(const std::string& instruction) {
  std::istringstream words(instruction);
  std::string opcode;
  words >> opcode;
  std::vector<std::string> parts;
  std::istringstream dotted(opcode);
  for (std::string part; std::getline(dotted, part, '.');) {
    parts.push_back(part);
  }
  if (parts.empty()) {
    return false;
  }
  static const std::set<std::string> kMemoryOps = {
      "ld", "ldu", "st", "atom", "red", "cp", "prefetch", "prefetchu", "applypriority", "discard"};
  if (kMemoryOps.count(parts[0]) == 0) {
    return false;
  }
  bool named_space = false;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    if (parts[i].starts_with("global")) {
      return true;
    }
    if (parts[i].starts_with("param") || parts[i].starts_with("shared") ||
        parts[i].starts_with("local") || parts[i].starts_with("const")) {
      named_space = true;
    }
  }
  return !named_space;
}

struct Checked {
  CompileRequest request;
  std::string ptx, lowered_name, error;
};

}  // namespace

TEST_CASE("the global-access predicate") {
  CHECK(touches_global_memory("ld.global.nc.v4.u32 {%r1, %r2, %r3, %r4}, [%rd5];"));
  CHECK(touches_global_memory("st.global.v4.u32 [%rd9], {%r1, %r2, %r3, %r4};"));
  CHECK(touches_global_memory("cp.async.cg.shared.global [%r3], [%rd4], 16;"));
  CHECK(touches_global_memory("ld.u32 %r1, [%rd2];"));
  CHECK(touches_global_memory("atom.add.f32 %f1, [%rd2], %f3;"));
  CHECK(touches_global_memory("applypriority.global.L2::evict_normal [%rd1], 128;"));
  CHECK_FALSE(touches_global_memory("ld.param.u64 %rd1, [_param_0];"));
  CHECK_FALSE(touches_global_memory("ld.shared.f32 %f1, [%r2];"));
  CHECK_FALSE(touches_global_memory("st.shared::cluster.f32 [%r2], %f1;"));
  CHECK_FALSE(touches_global_memory("mov.u32 %r1, %tid.x;"));
  CHECK_FALSE(touches_global_memory("griddepcontrol.wait;"));
}

TEST_CASE("every kernel waits for prior grids before touching global memory on sm_90") {
  std::vector<Checked> checks;
  for (const Family* fam : families()) {
    const std::int64_t hidden = fam->op() == Op::rope ? 128 : 2048;
    PrewarmModel model;
    model.training = true;
    for (const Problem& problem : fam->common_problems(DType::bf16, hidden, model)) {
      if (problem.op != fam->op()) {
        continue;
      }
      for (int sm : {80, 90}) {
        const DeviceTraits traits = DeviceTraits::for_arch(sm);
        checks.push_back(Checked{
            {fam, problem, fam->heuristic(problem, traits), sm, BinaryFormat::ptx}, {}, {}, {}});
        if (sm != 90) {
          continue;
        }
        std::set<std::string> extras_seen;
        for (const Config& config : fam->space(problem, traits)) {
          for (const auto& [name, value] : config.extra) {
            if (value == 0 || !extras_seen.insert(name).second) {
              continue;
            }
            checks.push_back(Checked{{fam, problem, config, sm, BinaryFormat::ptx}, {}, {}, {}});
          }
        }
      }
    }
  }
  REQUIRE(checks.size() >= 40);
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i; (i = next++) < checks.size();) {
      Expected<CompiledKernel> result = compile(checks[i].request, nullptr);
      if (!result) {
        checks[i].error = result.error().message();
        continue;
      }
      checks[i].ptx.assign(result->binary.begin(), result->binary.end());
      checks[i].lowered_name = result->lowered_name;
    }
  };
  std::vector<std::thread> helpers;
  const unsigned threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  for (unsigned t = 1; t < threads; ++t) {
    helpers.emplace_back(work);
  }
  work();
  for (auto& helper : helpers) {
    helper.join();
  }

  std::set<Op> ops_checked;
  for (const Checked& check : checks) {
    CAPTURE(check.request.problem.key());
    CAPTURE(check.request.config.key());
    CAPTURE(check.request.sm);
    REQUIRE_MESSAGE(check.error.empty(), check.error);
    const std::vector<std::string> body = entry_instructions(check.ptx, check.lowered_name);
    REQUIRE(!body.empty());
    std::size_t wait = body.size(), trigger = body.size(), first_access = body.size();
    for (std::size_t i = 0; i < body.size(); ++i) {
      if (wait == body.size() && body[i].starts_with("griddepcontrol.wait")) {
        wait = i;
      }
      if (trigger == body.size() && body[i].starts_with("griddepcontrol.launch_dependents")) {
        trigger = i;
      }
      if (first_access == body.size() && touches_global_memory(body[i])) {
        first_access = i;
      }
    }
    CHECK(first_access < body.size());
    if (check.request.sm >= 90) {
      CHECK(wait < first_access);
      CHECK(trigger < body.size());
      ops_checked.insert(check.request.problem.op);
    } else {
      CHECK(check.ptx.find("griddepcontrol") == std::string::npos);
    }
  }
  CHECK(ops_checked.size() == families().size());
}

}  // namespace kiln::jit
