// CUDA optimizer kernels: the fused Adam / AdamW / SGD updates of
// cpu_kernels.h for device-resident chunks, over the same AdamArrays /
// SgdArrays / configs, so a chunked optimizer fills one description and runs
// it where the chunk is.
//
// Design summary
// - One thread per element, grid-stride loop; the per-step scalars are
//   computed on the host exactly as the CPU kernels compute them (in double,
//   rounded to float where torch rounds them), and the element math uses only
//   explicitly rounded intrinsics (__fmaf_rn, __fmul_rn, __fdiv_rn,
//   __fsqrt_rn, ...), so nvcc cannot contract or approximate: the results
//   are those of the CPU kernels, element for element.
// - Pointers are device pointers; the kernel is queued on `stream` (a
//   cudaStream_t passed as void*, so this header needs no CUDA headers) and
//   the call returns without waiting.
// - Built only where the CUDA toolkit is found (library
//   spillway_optim_cuda_kernels, SPILLWAY_HAVE_OPTIM_CUDA=1 for its users).
#pragma once

#include <string>

#include "hooks/optim/cpu_kernels.h"

namespace spillway::optim::cuda {

// True when a CUDA device can run kernels; otherwise false with *reason set
// (no driver, no device).
bool device_available(std::string* reason);

// Queue one step on `stream`. False with *error set when the launch failed.
bool adam_step(const cpu::AdamArrays& arrays, const cpu::AdamConfig& config, void* stream,
               std::string* error);
bool sgd_step(const cpu::SgdArrays& arrays, const cpu::SgdConfig& config, void* stream,
              std::string* error);

// Waits for `stream`; false with *error set when queued work failed.
bool synchronize(void* stream, std::string* error);

}  // namespace spillway::optim::cuda
