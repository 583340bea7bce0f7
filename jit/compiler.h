// Source -> binary: specialise a family's template for (problem, config, arch), compile it
// with NVRTC, and go through the binary store. Needs no GPU (the offline half of kiln).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cache/binary_store.h"
#include "cache/expected.h"
#include "templates/family.h"

namespace kiln::jit {

enum class BinaryFormat { cubin, ptx };

struct CompileRequest {
  const Family* family = nullptr;
  Problem problem;
  Config config;
  int sm = 90;  // target arch (sm_XX)
  BinaryFormat format = BinaryFormat::cubin;
};

struct CompiledKernel {
  std::string key;              // content key of the binary (cache file name)
  std::string name_expression;  // kiln::norm<...>
  std::string lowered_name;     // the mangled symbol to look up in the module
  BinaryFormat format = BinaryFormat::cubin;
  std::vector<char> binary;  // cubin bytes, or PTX text
  std::string log;           // NVRTC's log (warnings), may be empty
  double compile_ms = 0;     // 0 when it came from the store
  bool from_cache = false;
};

// The canonical NVRTC options for a target (part of the binary key).
std::vector<std::string> compile_options(int sm, BinaryFormat format);

// The whole source NVRTC sees for a request: the family header's include and the
// explicit instantiation by name expression. Deterministic text.
std::string specialised_source(const CompileRequest& request);

// The content key: hash of every embedded source text, the specialised source, the name
// expression, the options, NVRTC's version, the arch and kiln's format version.
std::string binary_key(const CompileRequest& request);

// Looks the binary up in `store` (if given), else compiles with NVRTC and stores it.
// A compile failure is an Error carrying the full NVRTC log; nothing is stored then.
// In strict mode a store miss is an Error naming the specialisation. With an rw store, a miss
// takes the key's cross-process lock before compiling (cache/file_lock.h), so N processes
// missing the same key at once compile it once; a hit never locks. Compiles and their time
// are counted in the cache's statistics.
Expected<CompiledKernel> compile(const CompileRequest& request, BinaryStore* store);

// The stored binary for `request`, never compiling (what a CUDA graph capture may use);
// nullopt when `store` is null or has no valid entry for it.
std::optional<CompiledKernel> find_stored(const CompileRequest& request, BinaryStore* store);

}  // namespace kiln::jit
