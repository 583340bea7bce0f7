#include "jit/compiler.h"

#include <chrono>
#include <memory>
#include <optional>
#include <string_view>

#include "cache/cache_stats.h"
#include "cache/error.h"
#include "cache/file_lock.h"
#include "cache/hash.h"
#include "cache/log.h"
#include "jit/kernel_payload.h"
#include "jit/nvrtc.h"
#include "jit/target.h"

namespace kiln::jit {
namespace {

// Bump when the specialised source's shape or the options' meaning changes without the
// text showing it.
constexpr std::string_view kKeySchema = "kiln.binary.1";

std::string describe_request(const CompileRequest& request) {
  return std::string(request.family ? request.family->name() : "?") + " " + request.problem.key() +
         " config " + request.config.key() + " for sm_" + std::to_string(request.sm) + " (" +
         std::string(format_name(request.format)) + ")";
}

void require_family(const CompileRequest& request) {
  if (!request.family) throw Error("kiln: compile: the request names no op family");
}

CompileTarget target_for(const CompileRequest& request) {
  const Nvrtc& api = nvrtc();
  return choose_target(request.sm, request.format, api.archs, api.version_string());
}

// The key is of what is compiled (the effective target), so a request that falls back to PTX
// shares its entry with a direct request for that PTX.
std::string key_for(const CompileTarget& target, const std::string& source,
                    const std::string& expression) {
  const Nvrtc& api = nvrtc();
  std::vector<std::string> owned = {
      std::string(kKeySchema),
      "store format " + std::to_string(BinaryStore::kFormatVersion),
      "nvrtc " + api.version_string(),
      "target " + std::to_string(target.arch),
      std::string(format_name(target.format)),
      source,
      expression,
  };
  for (const auto& option : compile_options(target.arch, target.format)) owned.push_back(option);
  std::vector<std::string_view> parts(owned.begin(), owned.end());
  for (const auto& header : embedded_sources()) {
    parts.push_back(header.name);
    parts.push_back(header.text);
  }
  return content_key(std::span<const std::string_view>(parts));
}

CompiledKernel from_payload(KernelPayload payload, const std::string& key) {
  CompiledKernel kernel;
  kernel.key = key;
  kernel.name_expression = std::move(payload.name_expression);
  kernel.lowered_name = std::move(payload.lowered_name);
  kernel.format = payload.format;
  kernel.binary = std::move(payload.binary);
  kernel.from_cache = true;
  return kernel;
}

Expected<CompiledKernel> compile_with_nvrtc(const CompileRequest& request,
                                            const CompileTarget& target, const std::string& key,
                                            const std::string& source,
                                            const std::string& expression) {
  const auto start = std::chrono::steady_clock::now();
  NvrtcProgram program(source, request.problem.key() + "." + request.config.key() + ".cu",
                       embedded_sources());
  program.add_name_expression(expression);
  Expected<NvrtcOutput> output = program.compile(compile_options(target.arch, target.format),
                                                 target.format == BinaryFormat::cubin);
  if (!output) {
    return Error(
        "kiln: compiling " + describe_request(request) + " failed: " + output.error().message(),
        output.error().log());
  }
  CompiledKernel kernel;
  kernel.key = key;
  kernel.name_expression = expression;
  kernel.lowered_name = output->lowered_names.at(0);
  kernel.format = target.format;
  kernel.binary =
      target.format == BinaryFormat::cubin ? std::move(output->cubin) : std::move(output->ptx);
  kernel.log = target.note.empty() ? output->log
                                   : target.note + (output->log.empty() ? "" : "\n") + output->log;
  kernel.compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return kernel;
}

// The stored kernel for `key`, when the store has a valid one of this layout.
std::optional<CompiledKernel> stored_kernel(BinaryStore& store, const CompileRequest& request,
                                            const CompileTarget& target, const std::string& key,
                                            const std::string& expression, bool count_miss) {
  auto bytes = store.load(key, count_miss);
  if (!bytes) return std::nullopt;
  auto payload = decode_payload(*bytes);
  if (payload && payload->name_expression == expression && payload->format == target.format) {
    return from_payload(std::move(*payload), key);
  }
  log::warn("kiln: binary store entry " + key + " for " + describe_request(request) +
            " is not a kernel of this layout; recompiling");
  return std::nullopt;
}

// Serialises "compile + publish" of one key across processes: the first process that misses
// compiles; the others wait on the key's lock and then find the entry. Only rw stores lock
// (ro and strict never publish, off has no store).
std::unique_ptr<KeyLock> lock_for_compile(BinaryStore* store, const std::string& key) {
  if (!store || store->mode() != CacheMode::rw) return nullptr;
  auto lock = std::make_unique<KeyLock>(
      lock_path(store->root(), key), std::chrono::duration<double>(default_lock_timeout_seconds()));
  if (lock->waited()) {
    CacheCounters delta;
    delta.lock_waits = 1;
    delta.lock_timeouts = lock->outcome() == KeyLock::Outcome::timed_out ? 1 : 0;
    delta.lock_wait_ms = lock->waited_seconds() * 1e3;
    count_cache_event(store->root(), store->mode(), delta);
    if (delta.lock_timeouts) {
      log::info("kiln: waited " + std::to_string(lock->waited_seconds()) +
                " s for another process compiling " + key + "; compiling it here too");
    }
  }
  return lock;
}

}  // namespace

std::vector<std::string> compile_options(int sm, BinaryFormat format) {
  return {
      "-std=c++17",
      std::string("--gpu-architecture=") + (format == BinaryFormat::cubin ? "sm_" : "compute_") +
          std::to_string(sm),
  };
}

std::string specialised_source(const CompileRequest& request) {
  require_family(request);
  // The kernel is instantiated through NVRTC's name expression (which also yields its
  // mangled name); the comment makes each specialisation's source text distinct.
  return "#include \"" + std::string(request.family->header()) + "\"\n// instantiates " +
         request.family->name_expression(request.problem, request.config) + "\n";
}

std::string binary_key(const CompileRequest& request) {
  require_family(request);
  const CompileTarget target = target_for(request);
  return key_for(target, specialised_source(request),
                 request.family->name_expression(request.problem, request.config));
}

Expected<CompiledKernel> compile(const CompileRequest& request, BinaryStore* store) {
  try {
    require_family(request);
    const CompileTarget target = target_for(request);
    const std::string source = specialised_source(request);
    const std::string expression = request.family->name_expression(request.problem, request.config);
    const std::string key = key_for(target, source, expression);

    if (store) {
      if (auto hit = stored_kernel(*store, request, target, key, expression, true)) return *hit;
      if (store->mode() == CacheMode::strict) {
        return Error("kiln: KILN_CACHE=strict and the binary store " + store->root().string() +
                     " has no kernel for " + describe_request(request) + " (key " + key +
                     "); prewarm the cache with `kiln prewarm` or allow compiling (KILN_CACHE=rw)");
      }
    }

    // Readers above took no lock; only a miss that is about to compile does, and looks again
    // once it holds the lock, since the process it waited for has usually published the key.
    const std::unique_ptr<KeyLock> lock = lock_for_compile(store, key);
    if (lock && lock->outcome() != KeyLock::Outcome::unavailable) {
      if (auto hit = stored_kernel(*store, request, target, key, expression, false)) return *hit;
    }

    Expected<CompiledKernel> compiled =
        compile_with_nvrtc(request, target, key, source, expression);
    if (!compiled) return compiled;  // a failed compile publishes nothing
    CacheCounters delta;
    delta.compiles = 1;
    delta.compile_ms = compiled->compile_ms;
    if (store) {
      count_cache_event(store->root(), store->mode(), delta);
    } else {
      count_cache_event({}, CacheMode::off, delta);
    }
    if (!target.note.empty()) log::info("kiln: " + target.note);
    if (store) {
      const KernelPayload payload{compiled->format, compiled->name_expression,
                                  compiled->lowered_name, compiled->binary};
      store->store(key, encode_payload(payload));
    }
    return compiled;
  } catch (const Error& error) {
    return error;
  }
}

std::optional<CompiledKernel> find_stored(const CompileRequest& request, BinaryStore* store) {
  if (!store) return std::nullopt;
  require_family(request);
  const CompileTarget target = target_for(request);
  const std::string expression = request.family->name_expression(request.problem, request.config);
  const std::string key = key_for(target, specialised_source(request), expression);
  return stored_kernel(*store, request, target, key, expression, true);
}

}  // namespace kiln::jit
