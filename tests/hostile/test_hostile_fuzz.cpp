// Hostile checkpoint files found by the fuzzers (tools/fuzz) or aimed at the parsers they
// cover: each must end `bottle eval` with exit status 1 and one error naming the file, within
// 10 s, never a crash (issue 12, case 2).
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace bottle::testing {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Rewrites a safetensors file with `edit` applied to its JSON header text.
void edit_safetensors_header(const std::string& path,
                             const std::function<std::string(std::string)>& edit) {
  const std::string bytes = read_file(path);
  uint64_t len = 0;
  std::memcpy(&len, bytes.data(), 8);
  std::string header = edit(bytes.substr(8, len));
  header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t new_len = header.size();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&new_len), 8);
  out << header << bytes.substr(8 + len);
}

std::string nested_array(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

void set_config_key(const std::string& ckpt, const char* key, double value) {
  nlohmann::json j = nlohmann::json::parse(read_file(ckpt + "/config.json"));
  j[key] = value;
  std::ofstream(ckpt + "/config.json") << j.dump();
}

struct HostileCase {
  const char* name;
  std::function<void(const std::string& ckpt)> corrupt;
  std::vector<std::string> needles;  // all in the error message
};

const HostileCase kCases[] = {
    {"metadata nested 100000 levels",
     [](const std::string& ckpt) {
       // Replaces the metadata (a second "__metadata__" key would be refused as a duplicate).
       edit_safetensors_header(ckpt + "/model.safetensors", [](std::string h) {
         nlohmann::json j = nlohmann::json::parse(h);
         j["__metadata__"] = {{"x", "PLACEHOLDER"}};
         h = j.dump();
         return h.replace(h.find("\"PLACEHOLDER\""), 13, nested_array(100000));
       });
     },
     {"model.safetensors", "nests deeper than 64 levels"}},
    {"tensor entry nested 100000 levels",
     [](const std::string& ckpt) {
       edit_safetensors_header(ckpt + "/model.safetensors", [](std::string h) {
         return R"({"x":{"dtype":"F32","shape":)" + nested_array(100000) + "}," + h.substr(1);
       });
     },
     {"model.safetensors", "nests deeper than 64 levels"}},
    {"shape whose byte count overflows",
     [](const std::string& ckpt) {
       edit_safetensors_header(ckpt + "/model.safetensors", [](std::string h) {
         return R"({"x":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]},)" +
                h.substr(1);
       });
     },
     {"model.safetensors", "tensor 'x'", "more than 2^63 bytes"}},
    {"config.json nested 100000 levels",
     [](const std::string& ckpt) {
       std::ofstream(ckpt + "/config.json") << R"({"hidden_size":)" << nested_array(100000) << "}";
     },
     {"config.json", "nests deeper than 64 levels"}},
    // Out of the target type's range: nlohmann's cast would be undefined (found by UBSan).
    {"config.json hidden_size 2e19",
     [](const std::string& ckpt) { set_config_key(ckpt, "hidden_size", 2e19); },
     {"config.json", "'hidden_size'", "must be an integer"}},
    {"config.json rms_norm_eps 1e300",
     [](const std::string& ckpt) { set_config_key(ckpt, "rms_norm_eps", 1e300); },
     {"config.json", "'rms_norm_eps'", "finite"}},
};

TEST(HostileInput, ParsersRefuseByName) {
  for (const HostileCase& c : kCases) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    LlamaModel model(tiny_config(BottleneckKind::cola));
    model.init_weights(1);
    save_model(model, dir / "ckpt");
    write_random_shard(dir / "val.bin", 2 * 16 + 1, 64, 1);
    c.corrupt(dir / "ckpt");
    const CommandResult r =
        run(fmt::format("timeout -k 2 10 {} eval --checkpoint {} --data {} --batch 2 --seq 16",
                        bottle_binary(), dir / "ckpt", dir / "val.bin"));
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_NE(r.output.find("bottle: error:"), std::string::npos) << r.output;
    for (const std::string& n : c.needles)
      EXPECT_NE(r.output.find(n), std::string::npos) << "missing '" << n << "' in: " << r.output;
  }
}

}  // namespace
}  // namespace bottle::testing
