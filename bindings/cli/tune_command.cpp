// `kiln tune export|import|pin|unpin|replay`: move measured tuning results between machines
// as one JSON file, pin results so that upgrades and imports leave them as they are, and
// replay the fast search against the full tunes the cache holds.
#include <cstdio>
#include <memory>
#include <string>

#include "bindings/cli/commands.h"
#include "cache/settings.h"
#include "jit/tuning_bundle.h"
#include "jit/tuning_pin.h"
#include "tuner/replay.h"

namespace kiln::cli {
namespace {

struct TuneArgs {
  std::string cache_dir;
  std::string device;
  std::string bundle;
  bool pin_imports = false;
  jit::PinRequest pin;
  std::int64_t bucket = -1;
  report::Filter replay;
};

int report_transfer(const jit::TuneTransfer& transfer, const char* verb) {
  for (const auto& problem : transfer.problems) {
    std::fprintf(stderr, "skipped %s\n", problem.c_str());
  }
  std::printf("%s %llu tuning results (%llu invalid and skipped, %llu not stored)\n", verb,
              static_cast<unsigned long long>(transfer.written),
              static_cast<unsigned long long>(transfer.skipped_invalid),
              static_cast<unsigned long long>(transfer.failed));
  if (transfer.kept_pinned) {
    std::printf("kept %llu pinned results of this cache\n",
                static_cast<unsigned long long>(transfer.kept_pinned));
  }
  return transfer.failed ? 1 : 0;
}

int report_pins(const jit::PinOutcome& outcome, bool pin) {
  for (const auto& name : outcome.changed) {
    std::printf("%s %s\n", pin ? "pinned" : "unpinned", name.c_str());
  }
  for (const auto& name : outcome.unchanged) {
    std::printf("already %s %s\n", pin ? "pinned" : "unpinned", name.c_str());
  }
  return 0;
}

// The selection options pin and unpin share.
void add_selection(CLI::App* command, TuneArgs& args) {
  command->add_option("--device", args.pin.device,
                      "Only this device: its fingerprint, folder, or part of its name");
  command->add_option("--op", args.pin.op, "Only this op");
  command->add_option("--problem", args.pin.problem, "Only this problem key (see kiln report)");
  command->add_option("--bucket", args.bucket, "Only this row bucket")
      ->check(CLI::NonNegativeNumber);
}

}  // namespace

Runner add_tune_command(CLI::App& app) {
  auto args = std::make_shared<TuneArgs>();
  CLI::App* tune = app.add_subcommand("tune", "Export, import and pin tuning results");
  tune->require_subcommand(1);
  tune->add_option("--cache-dir", args->cache_dir, "Cache root (default: KILN_CACHE_DIR)");
  CLI::App* exp = tune->add_subcommand("export", "Write the tuning database to one JSON file");
  exp->add_option("file", args->bundle, "Bundle file to write")->required();
  exp->add_option("--device", args->device,
                  "Only this device: its fingerprint, folder, or part of its name");
  CLI::App* imp = tune->add_subcommand("import", "Validate a bundle and store its results");
  imp->add_option("file", args->bundle, "Bundle file to read")->required();
  imp->add_flag("--pin", args->pin_imports, "Pin the imported results");
  CLI::App* pin = tune->add_subcommand(
      "pin", "Keep tuning results whatever the versions, and from being replaced by imports");
  add_selection(pin, *args);
  pin->add_option("--config", args->pin.config,
                  "Make this measured candidate the winner (one result only)");
  CLI::App* unpin = tune->add_subcommand("unpin", "Undo kiln tune pin");
  add_selection(unpin, *args);
  CLI::App* replay = tune->add_subcommand(
      "replay", "Run the fast search on each full tune's recorded times: how far from the best");
  replay->add_option("--device", args->replay.device,
                     "Only this device: its fingerprint, folder, or part of its name");
  replay->add_option("--op", args->replay.op, "Only this op");
  return [=] {
    if (!*tune) {
      return -1;
    }
    const auto root =
        args->cache_dir.empty() ? default_cache_dir() : std::filesystem::path(args->cache_dir);
    if (*exp) {
      return report_transfer(jit::export_tuning(root, args->bundle, args->device), "exported");
    }
    if (*imp) {
      return report_transfer(jit::import_tuning(root, args->bundle, args->pin_imports), "imported");
    }
    if (*replay) {
      const ReplaySummary summary =
          replay_documents(jit::read_tuning_documents(root), args->replay);
      std::fputs(render_replay(summary).c_str(), stdout);
      return summary.outcomes.empty() ? 1 : 0;
    }
    if (*pin || *unpin) {
      args->pin.pin = bool(*pin);
      if (args->bucket >= 0) {
        args->pin.bucket = args->bucket;
      }
      return report_pins(jit::set_pinned(root, args->pin), args->pin.pin);
    }
    return -1;
  };
}

}  // namespace kiln::cli
