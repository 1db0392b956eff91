#include "hooks/torch/torch_parallel_for.h"

#include <ATen/Parallel.h>

#include <cstdint>

namespace spillway::optim {
namespace {

void run_on_torch_pool(int tasks, void* context, cpu::TaskFunction task) {
  at::parallel_for(0, tasks, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t index = begin; index < end; ++index) task(context, static_cast<int>(index));
  });
}

int torch_threads() { return at::get_num_threads(); }

}  // namespace

cpu::ParallelFor torch_parallel_for() { return {&run_on_torch_pool, &torch_threads}; }

cpu::ExecConfig torch_exec_config() {
  cpu::ExecConfig exec;
  exec.parallel_for = torch_parallel_for();
  return exec;
}

}  // namespace spillway::optim
