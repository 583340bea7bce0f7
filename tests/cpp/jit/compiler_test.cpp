#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cache/binary_store.h"
#include "jit/compiler.h"
#include "jit/nvrtc.h"
#include "jit_test_support.h"
#include "templates/rms_norm_family.h"

namespace kiln::jit {

using test::contains;
using test::ScratchDir;

namespace {

// The largest power of two (<= 16) dividing a contiguous row's byte length: what the
// bindings compute for a tensor whose base pointer is 16-byte aligned.
std::uint32_t row_align(DType dtype, std::int64_t hidden) {
  std::uint32_t align = 16;
  const auto bytes = static_cast<std::uint64_t>(hidden) * dtype_size(dtype);
  while (bytes % align != 0) align /= 2;
  return align;
}

Problem rms_problem(DType dtype, bool weight, std::int64_t hidden) {
  Problem problem;
  problem.op = Op::rms_norm;
  problem.dtype = dtype;
  problem.hidden = hidden;
  problem.flags = weight ? kRmsNormHasWeight : 0u;
  problem.align = row_align(dtype, hidden);
  return problem;
}

CompileRequest request_for(const Problem& problem, const Config& config, int sm,
                           BinaryFormat format) {
  return CompileRequest{&family(Op::rms_norm), problem, config, sm, format};
}

CompileRequest base_request(BinaryFormat format = BinaryFormat::cubin) {
  const Problem problem = rms_problem(DType::bf16, true, 4096);
  return request_for(problem, family(Op::rms_norm).heuristic(problem, DeviceTraits::for_arch(90)),
                     90, format);
}

// The heuristic and one other config of the space, for every class of RMSNorm
// specialisation: dtype x weight x hidden size (16-byte vectors, 2-byte elements only, a
// small row), on each arch kiln targets.
std::vector<CompileRequest> specialisation_matrix(BinaryFormat format) {
  std::vector<CompileRequest> requests;
  const Family& fam = family(Op::rms_norm);
  for (int sm : {75, 80, 90}) {
    const DeviceTraits traits = DeviceTraits::for_arch(sm);
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      for (bool weight : {true, false}) {
        for (std::int64_t hidden : {4096, 4545, 768}) {
          const Problem problem = rms_problem(dtype, weight, hidden);
          const Config heuristic = fam.heuristic(problem, traits);
          const std::vector<Config> space = fam.space(problem, traits);
          REQUIRE(space.size() >= 2);
          std::size_t other = space.size() / 2;
          if (space[other] == heuristic) other = (other + 1) % space.size();
          requests.push_back(request_for(problem, heuristic, sm, format));
          requests.push_back(request_for(problem, space[other], sm, format));
        }
      }
    }
  }
  return requests;
}

std::string label(const CompileRequest& request) {
  return request.problem.key() + " " + request.config.key() + " sm_" + std::to_string(request.sm);
}

// Compiles every request on all cores; NVRTC is most of this test's time.
std::vector<std::optional<Expected<CompiledKernel>>> compile_parallel(
    const std::vector<CompileRequest>& requests, BinaryStore* store) {
  std::vector<std::optional<Expected<CompiledKernel>>> results(requests.size());
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i; (i = next++) < requests.size();)
      results[i].emplace(compile(requests[i], store));
  };
  std::vector<std::thread> threads;
  for (unsigned i = 1; i < std::max(2u, std::thread::hardware_concurrency()); ++i) {
    threads.emplace_back(work);
  }
  work();
  for (auto& thread : threads) thread.join();
  return results;
}

std::string text(const std::vector<char>& bytes) {
  return {bytes.begin(), bytes.end()};
}

std::size_t bin_files(const std::filesystem::path& root) {
  std::size_t count = 0;
  std::error_code ec;
  if (!std::filesystem::exists(root, ec)) return 0;
  for (auto it = std::filesystem::recursive_directory_iterator(root, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file() && it->path().extension() == ".bin") ++count;
  }
  return count;
}

// A family whose name expression names no kernel: NVRTC must reject it.
class MisnamedFamily : public Family {
 public:
  Op op() const override { return Op::rms_norm; }
  std::string_view header() const override { return "kiln/norm.cuh"; }
  void check(const Problem&) const override {}
  std::vector<Config> space(const Problem&, const DeviceTraits&) const override {
    return {Config{}};
  }
  std::string invalid_reason(const Problem&, const Config&, const DeviceTraits&) const override {
    return {};
  }
  Config heuristic(const Problem&, const DeviceTraits&) const override { return {}; }
  std::string name_expression(const Problem&, const Config&) const override {
    return "kiln::kiln_no_such_kernel<kiln::bf16, 4096>";
  }
  LaunchGeometry geometry(const Problem&, const Config&, std::int64_t) const override { return {}; }
  std::vector<BufferSpec> buffers(const Problem&, std::int64_t) const override { return {}; }
  std::vector<std::byte> pack_params(const Problem&, std::int64_t,
                                     std::span<const std::uint64_t>) const override {
    return {};
  }
  std::int64_t bytes_moved(const Problem&, std::int64_t) const override { return 0; }
};

}  // namespace

TEST_CASE("every RMSNorm specialisation class compiles to cubin and to PTX for sm_75/80/90") {
  std::set<std::string> keys;
  std::size_t compiled_count = 0;
  for (BinaryFormat format : {BinaryFormat::cubin, BinaryFormat::ptx}) {
    const std::vector<CompileRequest> requests = specialisation_matrix(format);
    REQUIRE(requests.size() == 108);
    const auto results = compile_parallel(requests, nullptr);
    for (std::size_t i = 0; i < requests.size(); ++i) {
      const CompileRequest& request = requests[i];
      CAPTURE(label(request));
      const Expected<CompiledKernel>& result = *results[i];
      REQUIRE_MESSAGE(result.ok(), (result.ok() ? "" : result.error().what()));
      const CompiledKernel& kernel = result.value();
      ++compiled_count;
      CHECK(kernel.format == format);
      CHECK(kernel.name_expression ==
            request.family->name_expression(request.problem, request.config));
      CHECK(kernel.lowered_name.rfind("_Z", 0) == 0);  // a mangled C++ symbol
      CHECK_FALSE(kernel.from_cache);
      CHECK(kernel.compile_ms > 0);
      CHECK(kernel.key == binary_key(request));
      keys.insert(kernel.key);
      const std::string binary = text(kernel.binary);
      if (format == BinaryFormat::ptx) {
        CHECK(contains(binary, ".target sm_" + std::to_string(request.sm)));
        CHECK(contains(binary, ".entry " + kernel.lowered_name));
      } else {
        CHECK(binary.rfind("\x7f"
                           "ELF",
                           0) == 0);
        CHECK(contains(binary, kernel.lowered_name));
      }
    }
  }
  // Every specialisation, arch and format has its own binary.
  CHECK(keys.size() == compiled_count);
}

TEST_CASE("the binary key is stable and changes with everything that changes the binary") {
  const CompileRequest base = base_request();
  const std::string key = binary_key(base);
  CHECK(key.size() == 32);
  CHECK(key.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(binary_key(base) == key);
  CHECK(binary_key(base_request()) == key);

  std::vector<CompileRequest> variants;
  auto vary = [&](auto&& change) {
    CompileRequest request = base;
    change(request);
    variants.push_back(request);
  };
  vary([](CompileRequest& r) { r.problem.dtype = DType::f16; });
  vary([](CompileRequest& r) { r.problem.hidden = 2048; });
  vary([](CompileRequest& r) { r.problem.flags = 0; });
  vary([](CompileRequest& r) { r.config.vec_bytes = 8; });
  vary([](CompileRequest& r) { r.config.threads_per_row *= 2; });
  vary([](CompileRequest& r) { r.config.cta_threads *= 2; });
  vary([](CompileRequest& r) { r.sm = 80; });
  vary([](CompileRequest& r) { r.format = BinaryFormat::ptx; });
  std::set<std::string> seen = {key};
  for (const auto& variant : variants) {
    CAPTURE(label(variant));
    CHECK(seen.insert(binary_key(variant)).second);
  }
}

TEST_CASE("alignment reaches the binary only through the source it changes") {
  // align is part of Problem, so two problems that differ only in align either share a
  // binary (same source) or not; the key must follow the source, never the problem's text.
  CompileRequest a = base_request();
  CompileRequest b = a;
  b.problem.align = 8;
  CHECK((specialised_source(a) == specialised_source(b) &&
         a.family->name_expression(a.problem, a.config) ==
             b.family->name_expression(b.problem, b.config)) == (binary_key(a) == binary_key(b)));
}

TEST_CASE("the specialised source includes the family header and names the instantiation") {
  const CompileRequest request = base_request();
  const std::string source = specialised_source(request);
  CHECK(contains(source, "#include \"kiln/norm.cuh\""));
  CHECK(contains(source, request.family->name_expression(request.problem, request.config)));
  CHECK(source == specialised_source(base_request()));
}

TEST_CASE("a second compile through the binary store is a hit with the same bytes") {
  ScratchDir dir;
  for (BinaryFormat format : {BinaryFormat::cubin, BinaryFormat::ptx}) {
    CAPTURE(static_cast<int>(format));
    BinaryStore store(dir.path(), CacheMode::rw);
    const CompileRequest request = base_request(format);
    const CompiledKernel first = compile(request, &store).value();
    CHECK_FALSE(first.from_cache);
    CHECK(first.compile_ms > 0);
    CHECK(std::filesystem::exists(store.path_for(first.key)));

    const CompiledKernel second = compile(request, &store).value();
    CHECK(second.from_cache);
    CHECK(second.compile_ms == 0);
    CHECK(second.key == first.key);
    CHECK(second.binary == first.binary);
    CHECK(second.lowered_name == first.lowered_name);
    CHECK(second.name_expression == first.name_expression);
    CHECK(second.format == format);

    // A new store object on the same folder (a later process) hits as well.
    BinaryStore later(dir.path(), CacheMode::rw);
    const CompiledKernel third = compile(request, &later).value();
    CHECK(third.from_cache);
    CHECK(third.binary == first.binary);
  }
  CHECK(bin_files(dir.path()) == 2);  // cubin and PTX are different entries
}

TEST_CASE("a corrupted store entry is recompiled and replaced") {
  ScratchDir dir;
  BinaryStore store(dir.path(), CacheMode::rw);
  const CompileRequest request = base_request();
  const CompiledKernel first = compile(request, &store).value();
  const auto path = store.path_for(first.key);
  {
    // Flip bytes in the middle of the file: the entry's checksum no longer matches.
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    const auto size = std::filesystem::file_size(path);
    file.seekp(static_cast<std::streamoff>(size / 2));
    file.write("\x00\xff\x00\xff", 4);
  }
  const CompiledKernel again = compile(request, &store).value();
  CHECK_FALSE(again.from_cache);
  CHECK(again.lowered_name == first.lowered_name);
  CHECK(store.stats().corrupt >= 1);
  const CompiledKernel after = compile(request, &store).value();
  CHECK(after.from_cache);
  CHECK(after.binary == again.binary);
}

TEST_CASE("a valid store entry that is not a kernel payload is recompiled") {
  ScratchDir dir;
  BinaryStore store(dir.path(), CacheMode::rw);
  const CompileRequest request = base_request();
  const std::string key = binary_key(request);
  const std::string junk = "not a kernel";
  REQUIRE(store.store(key, std::span<const char>(junk.data(), junk.size())));
  const CompiledKernel compiled = compile(request, &store).value();
  CHECK_FALSE(compiled.from_cache);
  CHECK_FALSE(compiled.lowered_name.empty());
  CHECK(compile(request, &store).value().from_cache);
}

TEST_CASE("strict mode: a miss is an error naming the specialisation; a hit is served") {
  ScratchDir dir;
  const CompileRequest request = base_request();
  {
    BinaryStore strict(dir.path(), CacheMode::strict);
    Expected<CompiledKernel> missed = compile(request, &strict);
    REQUIRE_FALSE(missed.ok());
    const std::string message = missed.error().what();
    CHECK(contains(message, "strict"));
    CHECK(contains(message, request.problem.key()));
    CHECK(contains(message, request.config.key()));
    CHECK(contains(message, "sm_90"));
    CHECK(contains(message, binary_key(request)));
    CHECK(bin_files(dir.path()) == 0);
  }
  BinaryStore rw(dir.path(), CacheMode::rw);
  const CompiledKernel stored = compile(request, &rw).value();
  BinaryStore strict(dir.path(), CacheMode::strict);
  const CompiledKernel served = compile(request, &strict).value();
  CHECK(served.from_cache);
  CHECK(served.binary == stored.binary);
}

TEST_CASE("read-only and off modes compile but store nothing") {
  for (CacheMode mode : {CacheMode::ro, CacheMode::off}) {
    CAPTURE(cache_mode_name(mode));
    ScratchDir dir;
    BinaryStore store(dir.path(), mode);
    const CompiledKernel first = compile(base_request(), &store).value();
    CHECK_FALSE(first.from_cache);
    CHECK_FALSE(first.binary.empty());
    CHECK_FALSE(std::filesystem::exists(store.path_for(first.key)));
    CHECK(store.stats().stores == 0);
    CHECK(bin_files(dir.path()) == 0);
    CHECK_FALSE(compile(base_request(), &store).value().from_cache);
  }
}

TEST_CASE("an NVRTC failure is an Error with the log, and nothing is stored") {
  ScratchDir dir;
  BinaryStore store(dir.path(), CacheMode::rw);
  const MisnamedFamily misnamed;
  CompileRequest request = base_request();
  request.family = &misnamed;
  Expected<CompiledKernel> result = compile(request, &store);
  REQUIRE_FALSE(result.ok());
  CHECK(contains(result.error().message(), request.problem.key()));
  CHECK(contains(result.error().message(), "sm_90"));
  CHECK(contains(result.error().log(), "kiln_no_such_kernel"));
  CHECK(contains(result.error().what(), "kiln_no_such_kernel"));
  CHECK(store.stats().stores == 0);
  CHECK(bin_files(dir.path()) == 0);
}

TEST_CASE("a GPU newer than NVRTC gets PTX for NVRTC's newest arch; an old one is an error") {
  const int newest = nvrtc().archs.back();
  CompileRequest request = base_request(BinaryFormat::cubin);
  request.sm = newest + 10;
  const CompiledKernel kernel = compile(request, nullptr).value();
  CHECK(kernel.format == BinaryFormat::ptx);
  CHECK(contains(text(kernel.binary), ".target sm_" + std::to_string(newest)));
  CHECK(contains(kernel.log, "compute_" + std::to_string(newest)));
  // The key follows what is compiled: the same PTX as asking for that arch's PTX directly.
  CompileRequest direct = base_request(BinaryFormat::ptx);
  direct.sm = newest;
  CHECK(binary_key(request) == binary_key(direct));

  request.sm = 50;
  Expected<CompiledKernel> old = compile(request, nullptr);
  REQUIRE_FALSE(old.ok());
  CHECK(contains(old.error().what(), "sm_50"));
}

TEST_CASE("concurrent compiles of one kernel through one store agree") {
  ScratchDir dir;
  BinaryStore store(dir.path(), CacheMode::rw);
  const std::vector<CompileRequest> requests(6, base_request());
  const auto results = compile_parallel(requests, &store);
  for (const auto& result : results) {
    REQUIRE(result->ok());
    CHECK(result->value().lowered_name == results[0]->value().lowered_name);
    CHECK(result->value().key == results[0]->value().key);
  }
  CHECK(bin_files(dir.path()) == 1);
  CHECK(compile(base_request(), &store).value().from_cache);
}

TEST_CASE("a request with no family is an error, not a crash") {
  CompileRequest request = base_request();
  request.family = nullptr;
  Expected<CompiledKernel> result = compile(request, nullptr);
  REQUIRE_FALSE(result.ok());
  CHECK(contains(result.error().what(), "family"));
}

}  // namespace kiln::jit
