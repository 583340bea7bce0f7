// `kiln tune export|import`: move measured tuning results between machines as one JSON file.
#include <cstdio>
#include <memory>
#include <string>

#include "bindings/cli/commands.h"
#include "cache/settings.h"
#include "jit/tuning_bundle.h"

namespace kiln::cli {
namespace {

struct TuneArgs {
  std::string cache_dir;
  std::string device;
  std::string bundle;
};

int report_transfer(const jit::TuneTransfer& transfer, const char* verb) {
  for (const auto& problem : transfer.problems)
    std::fprintf(stderr, "skipped %s\n", problem.c_str());
  std::printf("%s %llu tuning results (%llu invalid and skipped, %llu not stored)\n", verb,
              static_cast<unsigned long long>(transfer.written),
              static_cast<unsigned long long>(transfer.skipped_invalid),
              static_cast<unsigned long long>(transfer.failed));
  return transfer.failed ? 1 : 0;
}

}  // namespace

Runner add_tune_command(CLI::App& app) {
  auto args = std::make_shared<TuneArgs>();
  CLI::App* tune = app.add_subcommand("tune", "Export and import tuning results");
  tune->require_subcommand(1);
  tune->add_option("--cache-dir", args->cache_dir, "Cache root (default: KILN_CACHE_DIR)");
  CLI::App* exp = tune->add_subcommand("export", "Write the tuning database to one JSON file");
  exp->add_option("file", args->bundle, "Bundle file to write")->required();
  exp->add_option("--device", args->device,
                  "Only this device: its fingerprint, folder, or part of its name");
  CLI::App* imp = tune->add_subcommand("import", "Validate a bundle and store its results");
  imp->add_option("file", args->bundle, "Bundle file to read")->required();
  return [=] {
    if (!*tune) return -1;
    const auto root =
        args->cache_dir.empty() ? default_cache_dir() : std::filesystem::path(args->cache_dir);
    if (*exp)
      return report_transfer(jit::export_tuning(root, args->bundle, args->device), "exported");
    if (*imp) return report_transfer(jit::import_tuning(root, args->bundle), "imported");
    return -1;
  };
}

}  // namespace kiln::cli
