// `kiln report`: the tuning database as JSON, Markdown or a self-contained HTML page.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "bindings/cli/commands.h"
#include "cache/error.h"
#include "cache/settings.h"
#include "jit/tuning_bundle.h"

namespace kiln::cli {
namespace {

struct ReportArgs {
  std::string cache_dir;
  std::string device;
  std::string op;
  std::string format = "md";
  std::string output;
};

int run_report(const ReportArgs& args) {
  const auto root =
      args.cache_dir.empty() ? default_cache_dir() : std::filesystem::path(args.cache_dir);
  const auto format = report::parse_format(args.format);
  if (!format) throw ArgumentError("report", "--format", "json, md or html", args.format);
  const std::string text = jit::tuning_report(root, {args.device, args.op}, *format);
  if (args.output.empty() || args.output == "-") {
    std::cout << text;
    return 0;
  }
  std::ofstream file(args.output, std::ios::binary);
  file << text;
  file.close();
  if (!file) throw Error("kiln report: could not write " + args.output);
  std::fprintf(stderr, "kiln: wrote %s\n", args.output.c_str());
  return 0;
}

}  // namespace

Runner add_report_command(CLI::App& app) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand("report", "Report what the tuning database holds");
  cmd->add_option("--cache-dir", args->cache_dir, "Cache root (default: KILN_CACHE_DIR)");
  cmd->add_option("--device", args->device,
                  "Only this device: its fingerprint, folder, or part of its name");
  cmd->add_option("--op", args->op, "Only this op family");
  cmd->add_option("--format", args->format, "json | md | html")
      ->check(CLI::IsMember({"json", "md", "markdown", "html"}))
      ->capture_default_str();
  cmd->add_option("-o,--output", args->output, "Output file (default: stdout)");
  return [=] { return *cmd ? run_report(*args) : -1; };
}

}  // namespace kiln::cli
