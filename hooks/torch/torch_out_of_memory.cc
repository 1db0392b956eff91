// The out-of-memory error torch's callers see when spillway cannot place an
// allocation even after spilling every chunk it could.
#include "hooks/torch/torch_out_of_memory.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include "allocator/caching/caching_allocator.h"
#include "allocator/config/format_bytes.h"
#include "allocator/runtime.h"

namespace spillway::torch_bridge {

void throw_out_of_memory(std::size_t bytes, Status status) {
  // The allocator's detail first: it is this thread's, and reading the stats
  // below makes no allocation that could replace it.
  const std::string detail = CachingAllocator::last_error();
  Runtime& runtime = Runtime::process();
  const CachingAllocator* allocator = runtime.active_allocator();
  const std::size_t budget = allocator != nullptr ? allocator->budget_bytes() : 0;
  const Stats stats = runtime.stats();
  const auto allocated =
      static_cast<std::size_t>(std::max<std::int64_t>(0, stats.allocated_bytes.current));
  const auto model =
      static_cast<std::size_t>(std::max<std::int64_t>(0, stats.allocated_bytes_model.current));
  const auto non_model =
      static_cast<std::size_t>(std::max<std::int64_t>(0, stats.allocated_bytes_non_model.current));
  const auto reserved =
      static_cast<std::size_t>(std::max<std::int64_t>(0, stats.reserved_bytes.current));
  const std::string message = fmt::format(
      "spillway: out of memory on {}: torch asked for {} ({} bytes), and spilling every chunk "
      "that no op is using did not make room. Budget {}; allocated {} ({} in model chunks, {} in "
      "other tensors: activations, temporaries, optimizer state outside chunks); reserved {}. "
      "{} ({}). To fit: "
      "make the step smaller (a smaller batch or shorter sequences, fewer tensors kept alive), "
      "or raise device_budget (now {}).",
      runtime.device().name(), format_bytes(bytes), bytes, format_bytes(budget),
      format_bytes(allocated), format_bytes(model), format_bytes(non_model), format_bytes(reserved),
      detail.empty() ? std::string("the allocator gave no detail") : detail, to_string(status),
      format_bytes(budget));
  C10_THROW_ERROR(OutOfMemoryError, message);  // TORCH_CHECK_WITH(OutOfMemoryError, ...)'s throw
}

void throw_chunk_out_of_memory(const std::string& what, const std::string& detail) {
  Runtime& runtime = Runtime::process();
  const CachingAllocator* allocator = runtime.active_allocator();
  const std::size_t budget = allocator != nullptr ? allocator->budget_bytes() : 0;
  C10_THROW_ERROR(OutOfMemoryError,
                  fmt::format("spillway: out of memory on {}: {} failed: {}. To fit: make the "
                              "step smaller, or raise device_budget (now {}).",
                              runtime.device().name(), what, detail, format_bytes(budget)));
}

}  // namespace spillway::torch_bridge
