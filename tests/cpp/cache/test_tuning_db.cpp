#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cache/tuning_db.h"
#include "temp_folder.h"

using kiln::CacheMode;
using kiln::TuningDb;
using kiln::test::bytes_of;
using kiln::test::files_containing;
using kiln::test::read_bytes;
using kiln::test::TempFolder;
using kiln::test::write_bytes;

namespace {

nlohmann::json sample_document(int vector_bytes) {
  return {{"winner", {{"vector_bytes", vector_bytes}, {"threads", 128}}},
          {"candidates", nlohmann::json::array({{{"vector_bytes", 8}, {"us", 3.5}}})},
          {"nvrtc", "13.0"}};
}

}  // namespace

TEST_CASE("tuning db paths are <root>/v1/tune/<device>/<problem>.r<bucket>.json") {
  TempFolder temp;
  TuningDb db(temp.path(), CacheMode::rw);
  CHECK(db.path_for("NVIDIA H100 80GB HBM3/sm90", "rms_norm.bf16.h4096", 64) ==
        temp.path() / "v1" / "tune" / "NVIDIA_H100_80GB_HBM3_sm90" /
            "rms_norm.bf16.h4096.r64.json");
}

TEST_CASE("tuning db round trip, written as indented JSON") {
  TempFolder temp;
  TuningDb db(temp.path(), CacheMode::rw);
  auto document = sample_document(16);
  CHECK_FALSE(db.load("gpu", "rms_norm.bf16.h4096", 128).has_value());
  REQUIRE(db.store("gpu", "rms_norm.bf16.h4096", 128, document));
  auto loaded = db.load("gpu", "rms_norm.bf16.h4096", 128);
  REQUIRE(loaded.has_value());
  CHECK(*loaded == document);
  CHECK_FALSE(db.load("gpu", "rms_norm.bf16.h4096", 256).has_value());
  CHECK_FALSE(db.load("other gpu", "rms_norm.bf16.h4096", 128).has_value());

  auto text = read_bytes(db.path_for("gpu", "rms_norm.bf16.h4096", 128));
  CHECK(std::string(text.begin(), text.end()).find("\n  \"winner\": {\n    \"threads\"") !=
        std::string::npos);

  REQUIRE(db.store("gpu", "rms_norm.bf16.h4096", 128, sample_document(4)));
  CHECK((*db.load("gpu", "rms_norm.bf16.h4096", 128))["winner"]["vector_bytes"] == 4);
  CHECK(files_containing(temp.path(), ".tmp.").empty());
}

TEST_CASE("a tuning document that is not usable is a miss and moved aside") {
  TempFolder temp;
  TuningDb db(temp.path(), CacheMode::rw);
  auto path = db.path_for("gpu", "ln.fp16.h1024", 8);
  REQUIRE(db.store("gpu", "ln.fp16.h1024", 8, sample_document(8)));

  std::string bad;
  SUBCASE("not JSON") {
    bad = "{\"winner\": {\"threads\": 12";
  }
  SUBCASE("empty file") {
    bad = "";
  }
  SUBCASE("not an object") {
    bad = "[1, 2, 3]";
  }
  SUBCASE("no winner") {
    bad = "{\"candidates\": []}";
  }
  write_bytes(path, bytes_of(bad));

  CHECK_FALSE(db.load("gpu", "ln.fp16.h1024", 8).has_value());
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK(files_containing(path.parent_path(), ".corrupt.").size() == 1);

  REQUIRE(db.store("gpu", "ln.fp16.h1024", 8, sample_document(8)));
  CHECK(db.load("gpu", "ln.fp16.h1024", 8) == sample_document(8));
}

TEST_CASE("tuning db list parses entries back, sorted, skipping other files") {
  TempFolder temp;
  TuningDb db(temp.path(), CacheMode::rw);
  REQUIRE(db.store("gpu b", "rms_norm.bf16.h4096", 1024, sample_document(16)));
  REQUIRE(db.store("gpu b", "rms_norm.bf16.h4096", 8, sample_document(16)));
  REQUIRE(db.store("gpu a", "rope.fp16.h128", 64, sample_document(8)));
  auto folder = db.path_for("gpu b", "x", 1).parent_path();
  write_bytes(folder / "notes.txt", bytes_of("not an entry"));
  write_bytes(folder / "rms_norm.bf16.h4096.rxyz.json", bytes_of("{}"));
  write_bytes(folder / ".rms_norm.bf16.h4096.r8.json.tmp.1.2", bytes_of("{}"));
  write_bytes(folder / "rms_norm.bf16.h4096.r2.json.corrupt.1.0", bytes_of("{}"));

  auto entries = db.list();
  REQUIRE(entries.size() == 3);
  CHECK(entries[0].device == "gpu_a");
  CHECK(entries[0].problem == "rope.fp16.h128");
  CHECK(entries[0].bucket == 64);
  CHECK(entries[0].path == db.path_for("gpu a", "rope.fp16.h128", 64));
  CHECK(entries[1].device == "gpu_b");
  CHECK(entries[1].problem == "rms_norm.bf16.h4096");
  CHECK(entries[1].bucket == 8);
  CHECK(entries[2].bucket == 1024);
  CHECK(entries[2].path == db.path_for("gpu b", "rms_norm.bf16.h4096", 1024));
}

TEST_CASE("tuning db modes and store failures") {
  TempFolder temp;
  REQUIRE(TuningDb(temp.path(), CacheMode::rw).store("gpu", "p", 1, sample_document(4)));
  SUBCASE("ro reads, never writes") {
    TuningDb db(temp.path(), CacheMode::ro);
    CHECK(db.load("gpu", "p", 1) == sample_document(4));
    CHECK_FALSE(db.store("gpu", "p", 2, sample_document(4)));
    CHECK_FALSE(std::filesystem::exists(db.path_for("gpu", "p", 2)));
    CHECK(db.list().size() == 1);
  }
  SUBCASE("off neither reads nor writes") {
    TuningDb db(temp.path(), CacheMode::off);
    CHECK_FALSE(db.load("gpu", "p", 1).has_value());
    CHECK_FALSE(db.store("gpu", "p", 2, sample_document(4)));
    CHECK_FALSE(std::filesystem::exists(db.path_for("gpu", "p", 2)));
    CHECK(db.list().empty());
  }
  SUBCASE("a root under a regular file: false, no exception") {
    write_bytes(temp.path() / "file", bytes_of("x"));
    TuningDb db(temp.path() / "file" / "cache", CacheMode::rw);
    bool stored = true;
    CHECK_NOTHROW(stored = db.store("gpu", "p", 1, sample_document(4)));
    CHECK_FALSE(stored);
    CHECK(db.list().empty());
  }
}

TEST_CASE("path_component makes one safe, non-empty path component") {
  CHECK(kiln::path_component("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3");
  CHECK(kiln::path_component("a/b\\c:d") == "a_b_c_d");
  CHECK(kiln::path_component("rms_norm.bf16-h4096") == "rms_norm.bf16-h4096");
  for (std::string_view text : {"", ".", "..", "/", ".hidden"}) {
    auto component = kiln::path_component(text);
    CAPTURE(text);
    CHECK_FALSE(component.empty());
    CHECK(component != ".");
    CHECK(component != "..");
    CHECK(component.front() != '.');
  }
  std::string every_byte;
  for (int c = 1; c < 256; ++c) every_byte.push_back(static_cast<char>(c));
  for (char c : kiln::path_component(every_byte)) {
    bool safe = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                c == '.' || c == '_' || c == '-';
    CHECK(safe);
  }
  std::string long_a(400, 'a'), long_b(400, 'a');
  long_b.back() = 'b';
  CHECK(kiln::path_component(long_a).size() <= 200);
  CHECK(kiln::path_component(long_a) != kiln::path_component(long_b));
}
