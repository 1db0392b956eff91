// Running a data parallel collective.
//
// Note [A failed collective names the missing ranks]
// When a rank dies or hangs, the others' collectives fail (Gloo: a peer's
// connection closed) or time out, and the backend's message names an
// address or a barrier, not the rank at fault. So each rank writes, in the
// group's store, the number of the data parallel operation it begins
// (note_progress: one store write per reduction or gathering, not per
// collective). A rank whose collective failed reads everyone's: the ranks
// behind it never reached this operation, and the error names them. A rank
// that dies inside the operation itself is not behind, and the error says
// that none is known. A rank blocked behind another's failure (a barrier
// that waits on rank 0, say) is not behind either, so it is not blamed.
#include "hooks/torch/collective_wait.h"

#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace spillway::torch_bridge {

namespace {

std::string progress_key(int rank) {
  return "spillway/data_parallel/progress/" + std::to_string(rank);
}

std::uint64_t progress_of(c10d::Store& store, int rank) {
  const std::string key = progress_key(rank);
  if (!store.check({key})) return 0;
  const std::vector<std::uint8_t> value = store.get(key);
  return std::stoull(std::string(value.begin(), value.end()));
}

// The ranks behind this one; empty when the store cannot tell.
std::vector<int> ranks_behind(c10d::ProcessGroup& group) {
  const c10::intrusive_ptr<c10d::Store> store = group.getStore();
  if (!store) return {};
  std::vector<int> behind;
  try {
    const std::uint64_t mine = progress_of(*store, group.getRank());
    for (int rank = 0; rank < group.getSize(); ++rank)
      if (progress_of(*store, rank) < mine) behind.push_back(rank);
  } catch (const std::exception&) {
    return {};  // the store went with the failure (rank 0's TCPStore, say)
  }
  return behind;
}

}  // namespace

void note_progress(c10d::ProcessGroup& group, std::uint64_t sequence) {
  const c10::intrusive_ptr<c10d::Store> store = group.getStore();
  if (!store) return;
  const std::string value = std::to_string(sequence);
  store->set(progress_key(group.getRank()), std::vector<std::uint8_t>(value.begin(), value.end()));
}

void run_collective(c10d::ProcessGroup& group, std::string_view what,
                    const std::function<c10::intrusive_ptr<c10d::Work>()>& issue) {
  try {
    issue()->wait();
  } catch (const std::exception& e) {
    const std::vector<int> behind = ranks_behind(group);
    const std::string who =
        behind.empty() ? std::string("no rank is known to have stopped before it")
                       : fmt::format("rank{} {} never reached it (died or hung before)",
                                     behind.size() > 1 ? "s" : "", fmt::join(behind, ", "));
    throw std::runtime_error(
        fmt::format("spillway data parallel: {} failed on rank {} of {}: {}. The backend said: {}",
                    what, group.getRank(), group.getSize(), who, e.what()));
  }
}

}  // namespace spillway::torch_bridge
