// libspillway_bench_adam.so: spillway's fp32 CPU AdamW behind one C function,
// so that bench_optim_compare.py can time it through ctypes in the same
// process, on the same tensors and thread count, as DeepSpeed's CPUAdam and
// torch's AdamW. A benchmark aid, not an API: the torch bridge is the way to
// use the kernels from Python.
#include <cstddef>
#include <cstdint>

#include "hooks/optim/cpu_kernels.h"

namespace cpu = spillway::optim::cpu;

extern "C" {

// One AdamW step (decoupled weight decay, torch's operation order) over count
// fp32 elements in place, on `threads` threads of the kernels' default pool
// (OpenMP); 0 threads: the pool's own count.
__attribute__((visibility("default"))) void spillway_bench_adamw_step(
    std::size_t count, float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
    std::int64_t step, double lr, double beta1, double beta2, double eps, double weight_decay,
    int threads) {
  cpu::AdamConfig config;
  config.lr = lr;
  config.beta1 = beta1;
  config.beta2 = beta2;
  config.eps = eps;
  config.weight_decay = weight_decay;
  config.decoupled_weight_decay = true;
  config.step = step;
  cpu::ExecConfig exec;
  exec.num_threads = threads;
  cpu::adam_step({count, params, grads, cpu::DType::f32, exp_avg, exp_avg_sq}, config, exec);
}

}  // extern "C"
