// rank_layout.h: which rank owns which managed parameter when models train
// data parallel (Note [Chunk groups across ranks] in rank_layout.cc). Private
// to hooks/torch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "hooks/torch/bridge.h"
#include "hooks/torch/collective_wait.h"

namespace spillway::torch_bridge {

// N consecutive parameter chunks of one client. members[j] holds the
// parameters of the group's j-th chunk, in offset order, and rank j owns
// them; an empty member past the client's last chunk is a virtual chunk.
struct ChunkGroup {
  std::vector<std::vector<std::shared_ptr<ManagedParam>>> members;
};

// Whether the owner's optimizer steps the tensor, so that every rank takes
// the owner's values: a parameter that requires grad. The rest (buffers,
// frozen parameters) take rank 0's (Note [What no optimizer steps comes
// from rank 0] in data_parallel.cc). Part of the layout the ranks compare.
inline bool stepped_by_owner(const ManagedParam& managed) { return managed.param.requires_grad(); }

// One client's parameters, grouped for `world_size` ranks.
struct RankLayout {
  ClientId client{};
  std::string client_name;
  std::vector<ChunkGroup> groups;
  // One line per parameter, in layout order: what every rank must agree on
  // (name, dtype, shape, chunk and offset).
  std::vector<std::string> descriptions;
};

// The layouts of the clients that hold managed parameters (models, not
// optimizers), in the order they were added; `only` limits them to one.
// Gives a gradient to every parameter unfrozen since manage() (Note [A
// parameter unfrozen after manage()] in manage.cc).
std::vector<RankLayout> rank_layouts(ChunkManager& chunks, int world_size,
                                     std::optional<ClientId> only = std::nullopt);

// All ranks' rows of `row` (int64), world_size x row.numel(), on the CPU (a
// collective; `what` names it in an error).
at::Tensor all_gather_rows(c10d::ProcessGroup& group, const at::Tensor& row, std::string_view what);

// all_gather_rows issued and not yet waited for.
class RowsInFlight {
 public:
  RowsInFlight(PendingCollective collective, std::vector<at::Tensor> rows);
  // Waits for them: world_size x row.numel(), on the CPU.
  at::Tensor wait();

 private:
  PendingCollective collective_;
  std::vector<at::Tensor> rows_;
};
RowsInFlight start_all_gather_rows(c10d::ProcessGroup& group, const at::Tensor& row,
                                   std::string_view what);

// Compares the layouts across the group's ranks (a collective: every rank
// calls it with its own). Throws std::runtime_error naming the first
// parameter where this rank's layout differs from rank 0's.
void check_layouts_agree(c10d::ProcessGroup& group, const std::vector<RankLayout>& layouts);

}  // namespace spillway::torch_bridge
