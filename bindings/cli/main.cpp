// The `kiln` command: inspect devices, compile specialisations offline, pre-warm and look
// after the cache.
#include <CLI/CLI.hpp>
#include <charconv>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include "bindings/cli/commands.h"
#include "cache/error.h"
#include "jit/compiler.h"
#include "jit/runtime.h"
#include "jit/specialisation.h"

namespace {

int run_devices() {
  kiln::jit::Runtime& runtime = kiln::jit::Runtime::get();
  int count = 0;
  try {
    count = runtime.device_count();
  } catch (const kiln::Error& error) {
    std::cout << "no CUDA device: " << error.message() << "\n";
    return 1;
  }
  if (count == 0) {
    std::cout << "no CUDA device: the driver reports none\n";
    return 1;
  }
  for (int i = 0; i < count; ++i) {
    const kiln::jit::DeviceInfo& d = runtime.device(i);
    std::printf(
        "%d: %s  sm_%d  %d SMs  %.1f GiB  L2 %.0f MiB  ~%.0f GB/s (datasheet)  driver %d\n"
        "   fingerprint %s\n",
        i, d.name.c_str(), d.sm(), d.sm_count, d.memory_bytes / double(1 << 30),
        d.l2_bytes / double(1 << 20), d.datasheet_bandwidth_gbs(), d.driver_version,
        d.fingerprint().c_str());
  }
  return 0;
}

struct CompileOptions {
  std::string op = "rms_norm";
  std::string dtype = "bf16";
  std::int64_t hidden = 0;
  bool no_weight = false;
  std::optional<std::uint32_t> flags;
  std::int64_t aux = 0;
  std::uint32_t align = 16;
  std::string arch = "native";
  std::string format = "ptx";
  int vec_bytes = 0, threads_per_row = 0, cta_threads = 0;
  std::vector<std::string> extra;  // NAME=VALUE family tunables
  std::optional<std::int64_t> rows;
  std::string output;
};

int run_compile(const CompileOptions& options) {
  kiln::jit::SpecialisationSpec spec;
  spec.op = options.op;
  spec.dtype = options.dtype;
  spec.hidden = options.hidden;
  spec.weight = !options.no_weight;
  spec.flags = options.flags;
  spec.align = options.align;
  spec.aux = options.aux;
  spec.rows = options.rows;
  spec.format =
      options.format == "cubin" ? kiln::jit::BinaryFormat::cubin : kiln::jit::BinaryFormat::ptx;
  kiln::jit::set_target_arch(spec, options.arch);
  if (options.vec_bytes || options.threads_per_row || options.cta_threads) {
    if (!(options.vec_bytes && options.threads_per_row && options.cta_threads)) {
      throw kiln::ArgumentError("compile", "config",
                                "all of --vec-bytes, --threads-per-row and --cta-threads",
                                "only some of them");
    }
    kiln::Config config;
    config.vec_bytes = options.vec_bytes;
    config.threads_per_row = options.threads_per_row;
    config.cta_threads = options.cta_threads;
    for (const std::string& item : options.extra) {
      const auto equals = item.find('=');
      std::int64_t value = 0;
      const char* end = item.data() + item.size();
      if (equals == std::string::npos ||
          std::from_chars(item.data() + equals + 1, end, value).ptr != end ||
          equals + 1 == item.size()) {
        throw kiln::ArgumentError("compile", "extra", "NAME=INTEGER", "'" + item + "'");
      }
      config.extra[item.substr(0, equals)] = value;
    }
    spec.config = config;
  }
  const kiln::jit::CompileRequest request = kiln::jit::make_compile_request(spec);
  const kiln::jit::Settings settings = kiln::jit::Runtime::get().settings();
  kiln::BinaryStore store(settings.cache_dir, settings.cache_mode);
  const kiln::jit::CompiledKernel kernel = kiln::jit::compile(request, &store).value();

  std::fprintf(stderr, "kiln: %s  config %s  sm_%d  %s  %s\n", kernel.name_expression.c_str(),
               request.config.key().c_str(), request.sm,
               kernel.from_cache ? "from cache" : "compiled",
               kernel.from_cache ? "" : (std::to_string(kernel.compile_ms) + " ms").c_str());
  if (options.output.empty() || options.output == "-") {
    std::cout.write(kernel.binary.data(), static_cast<std::streamsize>(kernel.binary.size()));
  } else {
    std::ofstream file(options.output, std::ios::binary);
    file.write(kernel.binary.data(), static_cast<std::streamsize>(kernel.binary.size()));
    if (!file) throw kiln::Error("kiln compile: could not write " + options.output);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln: JIT kernel compiler and autotuner for memory-bound transformer ops"};
  app.set_version_flag("--version", std::string("kiln ") + KILN_VERSION);
  app.require_subcommand(1);

  CLI::App* devices = app.add_subcommand("devices", "List CUDA devices as kiln sees them");

  CompileOptions options;
  CLI::App* compile = app.add_subcommand("compile", "Compile one specialisation to PTX or cubin");
  compile->add_option("--op", options.op, "Op family")->capture_default_str();
  compile->add_option("--dtype", options.dtype, "fp32 | fp16 | bf16")->capture_default_str();
  compile->add_option("--hidden", options.hidden, "Hidden size (last dimension)")->required();
  compile->add_flag("--no-weight", options.no_weight, "Specialise without a weight");
  compile->add_option("--flags", options.flags,
                      "The family's flag bits (overrides --no-weight; see its header)");
  compile->add_option("--aux", options.aux, "Problem aux size (e.g. RoPE's rotary dim)");
  compile->add_option("--align", options.align, "Guaranteed data alignment in bytes")
      ->capture_default_str();
  compile->add_option("--arch", options.arch, "Target arch (sm_75, sm_80, sm_90, or native)")
      ->capture_default_str();
  compile->add_option("--format", options.format, "ptx | cubin")
      ->check(CLI::IsMember({"ptx", "cubin"}))
      ->capture_default_str();
  compile->add_option("--vec-bytes", options.vec_bytes, "Config: bytes per vector access");
  compile->add_option("--threads-per-row", options.threads_per_row, "Config: threads per row");
  compile->add_option("--cta-threads", options.cta_threads, "Config: threads per CTA");
  compile->add_option("--extra", options.extra, "Config: family tunables, NAME=VALUE");
  compile->add_option("--rows", options.rows,
                      "Without a config: the heuristic for calls of this many rows");
  compile->add_option("-o,--output", options.output, "Output file (default: stdout)");

  const kiln::cli::Runner prewarm = kiln::cli::add_prewarm_command(app);
  const kiln::cli::Runner cache = kiln::cli::add_cache_command(app);
  const kiln::cli::Runner report = kiln::cli::add_report_command(app);
  const kiln::cli::Runner tune = kiln::cli::add_tune_command(app);

  CLI11_PARSE(app, argc, argv);
  try {
    if (*devices) return run_devices();
    if (*compile) return run_compile(options);
    for (const auto& runner : {prewarm, cache, report, tune}) {
      if (const int code = runner(); code >= 0) return code;
    }
  } catch (const kiln::Error& error) {
    std::cerr << "kiln: " << error.what() << "\n";
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "kiln: " << error.what() << "\n";
    return 2;
  }
  return 0;
}
