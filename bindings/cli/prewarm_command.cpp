// `kiln prewarm`: fill the cache ahead of time (see jit/prewarm.h for what is stored and what a
// GPU process then does with it).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bindings/cli/commands.h"
#include "cache/error.h"
#include "cache/manifest.h"
#include "jit/model_config.h"
#include "jit/prewarm.h"
#include "jit/runtime.h"
#include "jit/specialisation.h"
#include "tuner/tuner.h"

namespace kiln::cli {
namespace {

struct PrewarmArgs {
  std::vector<std::string> ops, dtypes, archs;
  std::vector<std::int64_t> hiddens;
  std::string config, manifest, cache_dir;
  int jobs = 0;
  bool tune = false;
  bool training = false;
  std::vector<std::int64_t> rows = {1, 64, 1024, 16384};
};

std::vector<Op> parse_ops(const std::vector<std::string>& names) {
  std::vector<Op> ops;
  for (const auto& name : names) {
    const auto op = parse_op(name);
    if (!op) {
      throw ArgumentError("prewarm", "--op", "a kiln op", "'" + name + "'");
    }
    ops.push_back(*op);
  }
  return ops;
}

std::vector<DType> parse_dtypes(const std::vector<std::string>& names) {
  std::vector<DType> dtypes;
  for (const auto& name : names) {
    const auto dtype = parse_dtype(name);
    if (!dtype) {
      throw ArgumentError("prewarm", "--dtype", "fp32, fp16 or bf16", "'" + name + "'");
    }
    dtypes.push_back(*dtype);
  }
  return dtypes;
}

// The GPU's arch when there is one, for a prewarm that names none.
std::vector<int> parse_archs(const std::vector<std::string>& names, bool required) {
  std::vector<int> archs;
  archs.reserve(names.size());
  for (const auto& name : names) {
    archs.push_back(jit::parse_arch(name));
  }
  if (archs.empty() && required) {
    int count = 0;
    try {
      count = jit::Runtime::get().device_count();
    } catch (const Error&) {
    }
    if (count == 0) {
      throw ArgumentError("prewarm", "--arch",
                          "the archs to compile for (no GPU here), e.g. "
                          "--arch sm_80,sm_90",
                          "none");
    }
    archs.push_back(jit::Runtime::get().device(0).sm());
  }
  return archs;
}

// A one-line bar redrawn in place; only on a terminal.
class ProgressBar {
 public:
  ProgressBar() : enabled_(::isatty(STDERR_FILENO) == 1) {}
  void update(std::size_t done, std::size_t total) {
    if (!enabled_ || total == 0) {
      return;
    }
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * done / total);
    std::fprintf(stderr, "\r[%s%s] %zu/%zu", std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, ' ').c_str(), done, total);
    if (done == total) {
      std::fputc('\n', stderr);
    }
    std::fflush(stderr);
  }

 private:
  bool enabled_;
};

int run_prewarm(const PrewarmArgs& args) {
  std::vector<std::string> notes;
  std::vector<jit::PrewarmTarget> targets;
  const std::vector<Op> ops = parse_ops(args.ops);
  std::vector<DType> dtypes = parse_dtypes(args.dtypes);
  if (dtypes.empty()) {
    dtypes = {DType::bf16};
  }

  if (!args.manifest.empty()) {
    const auto manifest = read_manifest(args.manifest);
    targets = jit::targets_from_manifest(manifest, parse_archs(args.archs, false), notes);
  }
  if (!args.config.empty()) {
    const jit::ModelShape model =
        jit::read_model_config(jit::read_config_file(args.config, "kiln prewarm"));
    std::vector<const jit::ModelShape*> parts{&model};
    for (const jit::ModelShape& tower : model.towers) {
      parts.push_back(&tower);
    }
    for (const jit::ModelShape* part : parts) {
      std::fprintf(stderr,
                   "kiln prewarm: %s: hidden %lld, intermediate %lld, head dim %lld, RoPE %s\n",
                   part->kind.c_str(), static_cast<long long>(part->hidden),
                   static_cast<long long>(part->intermediate),
                   static_cast<long long>(part->head_dim), part->rope.c_str());
    }
    auto more =
        jit::model_targets(model, ops, dtypes, parse_archs(args.archs, true), args.training, notes);
    targets.insert(targets.end(), more.begin(), more.end());
  }
  if (!args.hiddens.empty()) {
    if (ops.empty()) {
      throw ArgumentError("prewarm", "--op", "ops for --hidden", "none");
    }
    auto more = jit::listed_targets(ops, args.hiddens, dtypes, parse_archs(args.archs, true),
                                    args.training, notes);
    targets.insert(targets.end(), more.begin(), more.end());
  }
  if (args.manifest.empty() && args.config.empty() && args.hiddens.empty()) {
    throw ArgumentError("prewarm", "what to prewarm",
                        "--op with --hidden, --config config.json or --manifest FILE", "none");
  }
  for (const auto& note : notes) {
    std::fprintf(stderr, "kiln prewarm: %s\n", note.c_str());
  }

  jit::Settings settings = jit::Runtime::get().settings();
  if (!args.cache_dir.empty()) {
    settings.cache_dir = args.cache_dir;
    jit::Runtime::get().set_settings(settings);
  }
  if (settings.cache_mode != CacheMode::rw) {
    throw Error("kiln prewarm: the cache at " + settings.cache_dir.string() + " is in mode " +
                std::string(cache_mode_name(settings.cache_mode)) +
                "; prewarming writes to it (KILN_CACHE=rw)");
  }
  BinaryStore store(settings.cache_dir, settings.cache_mode);
  ProgressBar bar;
  std::mutex bar_mutex;
  jit::PrewarmOptions options;
  options.jobs = args.jobs > 0
                     ? args.jobs
                     : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  options.progress = [&](std::size_t done, std::size_t total) { bar.update(done, total); };
  const jit::PrewarmSummary summary = jit::prewarm(targets, store, options);
  for (const auto& failure : summary.failures) {
    std::fprintf(stderr, "kiln prewarm: failed: %s\n", failure.c_str());
  }

  std::size_t tuned = 0;
  if (args.tune) {
    jit::Runtime& runtime = jit::Runtime::get();
    if (runtime.device_count() == 0) {
      throw Error("kiln prewarm --tune: needs a GPU; none found");
    }
    const int sm = runtime.device(0).sm();
    for (const auto& target : targets) {
      if (target.sm != sm) {
        continue;
      }
      for (std::int64_t rows : args.rows) {
        try {
          tuned += runtime.tune_and_store(0, target.problem, rows) ? 1 : 0;
        } catch (const Error& error) {
          std::fprintf(stderr, "kiln prewarm: tuning %s rows %lld failed: %s\n",
                       target.problem.key().c_str(), static_cast<long long>(rows),
                       error.message().c_str());
        }
      }
    }
  }
  std::printf("kiln prewarm: compiled %zu, reused %zu, failed %zu%s, time %.1f s (cache %s)\n",
              summary.compiled, summary.reused, summary.failed,
              args.tune ? (", tuned " + std::to_string(tuned)).c_str() : "", summary.seconds,
              settings.cache_dir.c_str());
  return summary.failed ? 1 : 0;
}

}  // namespace

Runner add_prewarm_command(CLI::App& app) {
  auto args = std::make_shared<PrewarmArgs>();
  CLI::App* cmd = app.add_subcommand(
      "prewarm", "Compile kernels into the cache ahead of time (no GPU needed; --tune with one)");
  cmd->add_option("--op", args->ops, "Ops, comma separated (default with --config: the model's)")
      ->delimiter(',');
  cmd->add_option("--dtype", args->dtypes, "Dtypes, comma separated (default bf16)")
      ->delimiter(',');
  cmd->add_option("--hidden", args->hiddens, "Hidden sizes for --op, comma separated")
      ->delimiter(',');
  cmd->add_option("--arch", args->archs,
                  "Target archs, comma separated, e.g. sm_80,sm_90 (default: the GPU's)")
      ->delimiter(',');
  cmd->add_option("--config", args->config,
                  "A Hugging Face config.json (Llama, Mistral, Qwen, Gemma 3, LTX-Video, FLUX, "
                  "Wan, ...), or a model's or diffusers pipeline's folder");
  cmd->add_option("--manifest", args->manifest,
                  "A manifest recorded by a real run with KILN_RECORD=FILE");
  cmd->add_option("-j,--jobs", args->jobs, "Parallel compiles (default: CPU count)");
  cmd->add_flag("--tune", args->tune, "Also tune for the GPU present (its arch's targets)");
  cmd->add_flag("--training", args->training,
                "Also the backward kernels of the ops (for --op and --config)");
  cmd->add_option("--rows", args->rows, "With --tune: row counts to tune for")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--cache-dir", args->cache_dir, "Cache root (default: KILN_CACHE_DIR)");
  return [cmd, args] { return *cmd ? run_prewarm(*args) : -1; };
}

}  // namespace kiln::cli
