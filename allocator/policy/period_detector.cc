// PeriodDetector (period_detector.h).
#include "allocator/policy/period_detector.h"

#include <algorithm>
#include <unordered_set>

namespace spillway {
namespace {

// An odd multiplier: the polynomial hash is taken modulo 2^64.
constexpr std::uint64_t kBase = 0x9e3779b97f4a7c15ULL;

// splitmix64's finaliser, so that neighbouring chunk ids hash far apart.
std::uint64_t mix(ChunkId chunk) {
  std::uint64_t x = static_cast<std::uint64_t>(chunk) + 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

void PeriodDetector::push(ChunkId chunk) {
  if (prefix_hash_.empty()) {
    prefix_hash_.push_back(0);
    powers_.push_back(1);
  }
  const std::size_t index = chunks_.size();
  chunks_.push_back(chunk);
  prefix_hash_.push_back(prefix_hash_.back() * kBase + mix(chunk));
  powers_.push_back(powers_.back() * kBase);
  const std::size_t context_begin = index + 1 >= kContext ? index + 1 - kContext : 0;
  const auto [last, first_time] =
      last_with_context_.try_emplace(window_hash(context_begin, index + 1), index);
  previous_with_context_.push_back(first_time ? kNone : last->second);
  last->second = index;
}

std::optional<std::size_t> PeriodDetector::find_period() const {
  const std::size_t size = chunks_.size();
  if (size < kCoverageWindow) return std::nullopt;
  const std::size_t latest = size - 1;
  // Earlier accesses with the latest one's context, nearest first: the
  // shortest periods first.
  std::size_t earlier = previous_with_context_[latest];
  for (std::size_t tried = 0; earlier != kNone && tried < kMaxCandidates;
       earlier = previous_with_context_[earlier], ++tried) {
    const std::size_t period = latest - earlier;
    if (2 * period > size) break;  // farther ones are longer still
    if (repeats(period) && covers_recent_chunks(period)) return period;
  }
  return std::nullopt;
}

std::uint64_t PeriodDetector::window_hash(std::size_t begin, std::size_t end) const {
  return prefix_hash_[end] - prefix_hash_[begin] * powers_[end - begin];
}

bool PeriodDetector::repeats(std::size_t period) const {
  const std::size_t size = chunks_.size();
  const std::size_t first = size - 2 * period;
  const std::size_t second = size - period;
  if (window_hash(first, second) != window_hash(second, size)) return false;
  return std::equal(chunks_.begin() + static_cast<std::ptrdiff_t>(first),
                    chunks_.begin() + static_cast<std::ptrdiff_t>(second),
                    chunks_.begin() + static_cast<std::ptrdiff_t>(second));
}

bool PeriodDetector::covers_recent_chunks(std::size_t period) const {
  const std::size_t size = chunks_.size();
  const std::unordered_set<ChunkId> in_period(
      chunks_.begin() + static_cast<std::ptrdiff_t>(size - period), chunks_.end());
  // The copy before it holds the same chunks; what came before that may not.
  const std::size_t window = std::min(size, std::max(3 * period, kCoverageWindow));
  const std::size_t from = size - window;
  return std::all_of(chunks_.begin() + static_cast<std::ptrdiff_t>(from),
                     chunks_.begin() + static_cast<std::ptrdiff_t>(size - 2 * period),
                     [&](ChunkId chunk) { return in_period.contains(chunk); });
}

void PeriodDetector::keep_latest(std::size_t keep) {
  if (chunks_.size() <= keep) return;
  std::vector<ChunkId> kept(chunks_.end() - static_cast<std::ptrdiff_t>(keep), chunks_.end());
  clear();
  for (ChunkId chunk : kept) push(chunk);
}

void PeriodDetector::clear() {
  chunks_.clear();
  prefix_hash_.clear();
  powers_.clear();
  last_with_context_.clear();
  previous_with_context_.clear();
}

}  // namespace spillway
