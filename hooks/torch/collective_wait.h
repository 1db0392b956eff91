// collective_wait.h: running a data parallel collective, and an error that
// names the ranks gone missing when it fails (Note [A failed collective
// names the missing ranks] in collective_wait.cc). Private to hooks/torch.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace spillway::torch_bridge {

// Records in the group's store that this rank began its `sequence`-th data
// parallel operation (a reduction, a gathering, a join): what a failure
// compares. Every rank counts the same operations.
void note_progress(c10d::ProcessGroup& group, std::uint64_t sequence);

// Issues a collective with `issue` and waits for it. When either fails,
// throws std::runtime_error saying `what` failed, which ranks never reached
// this operation, and the backend's own message.
void run_collective(c10d::ProcessGroup& group, std::string_view what,
                    const std::function<c10::intrusive_ptr<c10d::Work>()>& issue);

}  // namespace spillway::torch_bridge
