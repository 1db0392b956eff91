// The bounds bench_optim divides spillway's CPU Adam by (Note [The Adam bound]
// in bench_optim.cc): an in-place stream with Adam's accesses, and Adam's
// bytes read and written timed apart (a reduction, non-temporal stores).
#pragma once

#include <cstddef>

namespace spillway::bench {

// One pass over count elements: p, g, m, v read, p, m, v written back with
// ordinary stores, on `threads` OpenMP threads, one contiguous range each.
void adam_shaped_stream(std::size_t count, float* p, const float* g, float* m, float* v,
                        int threads);

// Reads p, g, m and v once (16 bytes per element) and sums them, on `threads`
// OpenMP threads; the sum keeps the reads from being optimized away.
float adam_read_pass(std::size_t count, const float* p, const float* g, const float* m,
                     const float* v, int threads);

// Writes p, m and v once (12 bytes per element) with non-temporal stores,
// which skip the read-for-ownership an ordinary store to a missing line
// costs; p = 0.5, m = v = 0, the values AdamState starts from.
void adam_nt_write_pass(std::size_t count, float* p, float* m, float* v, int threads);

}  // namespace spillway::bench
