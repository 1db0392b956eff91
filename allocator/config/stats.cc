#include "allocator/config/stats.h"

#include <nlohmann/json.hpp>

namespace spillway {

void Stats::reset_peaks() {
#define SPILLWAY_RESET_PEAK(member, key) member.reset_peak();
  SPILLWAY_STAT_ARRAYS(SPILLWAY_RESET_PEAK)
  SPILLWAY_STAT_PARTS(SPILLWAY_RESET_PEAK)
#undef SPILLWAY_RESET_PEAK
}

double Stats::chunk_fill_ratio() const {
  return spillway::chunk_fill_ratio(chunk_bytes_tensors, chunk_bytes_capacity);
}

std::vector<std::pair<std::string, std::int64_t>> Stats::flatten() const {
  std::vector<std::pair<std::string, std::int64_t>> figures;
#define SPILLWAY_FLATTEN_ARRAY(member, key)                     \
  figures.emplace_back(key ".all.current", member.current);     \
  figures.emplace_back(key ".all.peak", member.peak);           \
  figures.emplace_back(key ".all.allocated", member.allocated); \
  figures.emplace_back(key ".all.freed", member.freed);
#define SPILLWAY_FLATTEN_PART(member, key)                  \
  figures.emplace_back(key ".current", member.current);     \
  figures.emplace_back(key ".peak", member.peak);           \
  figures.emplace_back(key ".allocated", member.allocated); \
  figures.emplace_back(key ".freed", member.freed);
#define SPILLWAY_FLATTEN_SCALAR(member, key) figures.emplace_back(key, member);
  SPILLWAY_STAT_ARRAYS(SPILLWAY_FLATTEN_ARRAY)
  SPILLWAY_STAT_PARTS(SPILLWAY_FLATTEN_PART)
  SPILLWAY_STAT_SCALARS(SPILLWAY_FLATTEN_SCALAR)
#undef SPILLWAY_FLATTEN_ARRAY
#undef SPILLWAY_FLATTEN_PART
#undef SPILLWAY_FLATTEN_SCALAR
  return figures;
}

std::string Stats::to_json() const {
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  for (const auto& [key, value] : flatten()) json[key] = value;
  json["chunk_fill_ratio"] = chunk_fill_ratio();
  return json.dump();
}

}  // namespace spillway
