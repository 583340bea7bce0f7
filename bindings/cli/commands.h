// The `kiln` subcommands beside devices and compile: each adds itself to the app and returns
// a runner to call when it was chosen.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace kiln::cli {

using Runner = std::function<int()>;

Runner add_prewarm_command(CLI::App& app);
Runner add_cache_command(CLI::App& app);
Runner add_report_command(CLI::App& app);
Runner add_tune_command(CLI::App& app);

}  // namespace kiln::cli
