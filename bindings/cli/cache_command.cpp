// `kiln cache ls|stats|verify|trim|clear|export|import`: look after a cache as a whole.
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "bindings/cli/commands.h"
#include "cache/cache_admin.h"
#include "cache/cache_stats.h"
#include "cache/error.h"
#include "cache/settings.h"
#include "cache/tuning_db.h"

namespace kiln::cli {
namespace {

struct CacheArgs {
  std::string cache_dir;
  std::string max_size;
  std::string bundle;
  bool json = false;
};

std::filesystem::path root_of(const CacheArgs& args) {
  return args.cache_dir.empty() ? default_cache_dir() : std::filesystem::path(args.cache_dir);
}

std::string when(std::int64_t seconds) {
  const std::time_t t = static_cast<std::time_t>(seconds);
  std::tm local{};
  localtime_r(&t, &local);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S", &local);
  return text;
}

int run_ls(const CacheArgs& args) {
  const auto root = root_of(args);
  std::uint64_t total = 0;
  const auto entries = list_binary_entries(root);
  for (const auto& entry : entries) {
    std::printf("%s  %10s  last used %s\n", entry.key.c_str(), format_size(entry.bytes).c_str(),
                when(entry.last_used).c_str());
    total += entry.bytes;
  }
  const auto tuning = TuningDb(root, CacheMode::ro).list();
  for (const auto& entry : tuning) {
    std::printf("tune  %s  %s  rows<=%lld\n", entry.device.c_str(), entry.problem.c_str(),
                static_cast<long long>(entry.bucket));
  }
  std::printf("%zu binaries (%s), %zu tuning results, in %s\n", entries.size(),
              format_size(total).c_str(), tuning.size(), root.c_str());
  return 0;
}

int run_stats(const CacheArgs& args) {
  const auto root = root_of(args);
  const CacheCounters c = persisted_cache_counters(root);
  std::uint64_t bytes = 0;
  const auto entries = list_binary_entries(root);
  for (const auto& entry : entries) bytes += entry.bytes;
  if (args.json) {
    nlohmann::json j = c;
    j["cache_dir"] = root.string();
    j["binaries"] = entries.size();
    j["bytes"] = bytes;
    j["max_bytes"] = default_cache_max_bytes();
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  auto rate = [](std::uint64_t hits, std::uint64_t misses) {
    return hits + misses ? 100.0 * static_cast<double>(hits) / static_cast<double>(hits + misses)
                         : 0.0;
  };
  std::printf("cache             %s\n", root.c_str());
  std::printf("size              %s in %zu binaries (bound %s)\n", format_size(bytes).c_str(),
              entries.size(), format_size(default_cache_max_bytes()).c_str());
  std::printf("binary store      %llu hits, %llu misses (%.1f%% hits)\n",
              static_cast<unsigned long long>(c.binary_hits),
              static_cast<unsigned long long>(c.binary_misses),
              rate(c.binary_hits, c.binary_misses));
  std::printf("tuning database   %llu hits, %llu misses (%.1f%% hits)\n",
              static_cast<unsigned long long>(c.tuning_hits),
              static_cast<unsigned long long>(c.tuning_misses),
              rate(c.tuning_hits, c.tuning_misses));
  std::printf("compiles          %llu (%.1f s of NVRTC)\n",
              static_cast<unsigned long long>(c.compiles), c.compile_ms / 1e3);
  std::printf("stores            %llu, %llu failed\n", static_cast<unsigned long long>(c.stores),
              static_cast<unsigned long long>(c.store_failures));
  std::printf("corrupt entries   %llu (moved aside, rebuilt)\n",
              static_cast<unsigned long long>(c.corrupt));
  std::printf("lock waits        %llu (%llu timed out, %.1f s waited)\n",
              static_cast<unsigned long long>(c.lock_waits),
              static_cast<unsigned long long>(c.lock_timeouts), c.lock_wait_ms / 1e3);
  std::printf("evicted           %llu (%s)\n", static_cast<unsigned long long>(c.evicted),
              format_size(c.evicted_bytes).c_str());
  return 0;
}

int run_verify(const CacheArgs& args) {
  const VerifyResult result = verify_cache(root_of(args));
  for (const auto& problem : result.problems)
    std::printf("bad: %s (moved aside)\n", problem.c_str());
  std::printf("verified %llu binaries (%llu bad) and %llu tuning results (%llu bad)\n",
              static_cast<unsigned long long>(result.binaries),
              static_cast<unsigned long long>(result.bad_binaries),
              static_cast<unsigned long long>(result.tuning_results),
              static_cast<unsigned long long>(result.bad_tuning_results));
  return result.bad_binaries || result.bad_tuning_results ? 1 : 0;
}

int run_trim(const CacheArgs& args) {
  std::uint64_t max_bytes = default_cache_max_bytes();
  if (!args.max_size.empty()) {
    const auto parsed = parse_size(args.max_size);
    if (!parsed)
      throw ArgumentError("cache trim", "--max-size", "a size such as 2G", args.max_size);
    max_bytes = *parsed;
  }
  const TrimResult result = trim_cache(root_of(args), max_bytes, max_bytes);
  std::printf("removed %llu binaries (%s) and %llu stale files; kept %llu (%s)\n",
              static_cast<unsigned long long>(result.removed),
              format_size(result.removed_bytes).c_str(),
              static_cast<unsigned long long>(result.debris_removed),
              static_cast<unsigned long long>(result.kept), format_size(result.kept_bytes).c_str());
  return 0;
}

int run_clear(const CacheArgs& args) {
  const auto removed = clear_cache(root_of(args));
  std::printf("removed %llu files from %s\n", static_cast<unsigned long long>(removed),
              root_of(args).c_str());
  return 0;
}

int run_transfer(const CacheArgs& args, bool exporting) {
  const auto root = root_of(args);
  const TransferResult result =
      exporting ? export_cache(root, args.bundle) : import_cache(root, args.bundle);
  std::printf("%s %llu entries (%llu already there, %llu invalid and skipped)\n",
              exporting ? "exported" : "imported", static_cast<unsigned long long>(result.copied),
              static_cast<unsigned long long>(result.present),
              static_cast<unsigned long long>(result.bad));
  return 0;
}

}  // namespace

Runner add_cache_command(CLI::App& app) {
  auto args = std::make_shared<CacheArgs>();
  CLI::App* cache = app.add_subcommand("cache", "Inspect and look after the disk cache");
  cache->require_subcommand(1);
  cache->add_option("--cache-dir", args->cache_dir, "Cache root (default: KILN_CACHE_DIR)");
  CLI::App* ls = cache->add_subcommand("ls", "List binaries (with last use) and tuning results");
  CLI::App* stats = cache->add_subcommand("stats", "Hits, misses, compiles, corrupt entries, ...");
  stats->add_flag("--json", args->json, "As JSON");
  CLI::App* verify = cache->add_subcommand("verify", "Validate every entry; move bad ones aside");
  CLI::App* trim = cache->add_subcommand("trim", "Remove least recently used binaries");
  trim->add_option("--max-size", args->max_size,
                   "Size bound, e.g. 2G (default KILN_CACHE_MAX_SIZE)");
  CLI::App* clear = cache->add_subcommand("clear", "Remove everything in the cache");
  CLI::App* exp = cache->add_subcommand("export", "Copy valid entries into a bundle folder");
  exp->add_option("bundle", args->bundle, "Destination folder")->required();
  CLI::App* imp = cache->add_subcommand("import", "Copy valid entries of a bundle folder in");
  imp->add_option("bundle", args->bundle, "Bundle folder")->required();
  return [=] {
    if (!*cache) return -1;
    if (*ls) return run_ls(*args);
    if (*stats) return run_stats(*args);
    if (*verify) return run_verify(*args);
    if (*trim) return run_trim(*args);
    if (*clear) return run_clear(*args);
    if (*exp) return run_transfer(*args, true);
    if (*imp) return run_transfer(*args, false);
    return -1;
  };
}

}  // namespace kiln::cli
