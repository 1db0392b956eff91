// The bound bench_optim divides spillway's CPU Adam by (Note [The Adam bound]
// in bench_optim.cc): an in-place stream with Adam's accesses.
#pragma once

#include <cstddef>

namespace spillway::bench {

// One pass over count elements: p, g, m, v read, p, m, v written back with
// ordinary stores, on `threads` OpenMP threads, one contiguous range each.
void adam_shaped_stream(std::size_t count, float* p, const float* g, float* m, float* v,
                        int threads);

}  // namespace spillway::bench
