// torch's intra-op thread pool as the CPU optimizer kernels' pool
// (cpu::ParallelFor; Note [Kernel threads] in hooks/optim/cpu_kernels.cc), so
// the chunked optimizers run on the threads torch.set_num_threads /
// at::set_num_threads and OMP_NUM_THREADS size, in the OpenMP runtime torch
// brought, and start no second pool beside it.
#pragma once

#include "hooks/optim/cpu_kernels.h"

namespace spillway::optim {

// Runs the tasks with at::parallel_for (one task per chunk of grain 1). Called
// from inside a torch parallel region, it runs them on the calling thread.
cpu::ParallelFor torch_parallel_for();

// ExecConfig on torch's pool: num_threads 0 means at::get_num_threads().
cpu::ExecConfig torch_exec_config();

}  // namespace spillway::optim
