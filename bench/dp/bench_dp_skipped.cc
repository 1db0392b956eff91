// bench_dp where Torch was not found: says so, measures nothing.
#include "bench/common/metric_reporter.h"

int main(int argc, char** argv) {
  spillway::bench::initialize(&argc, argv);
  spillway::bench::report_note("dp: skipped (Torch not found at configure time)");
  return spillway::bench::run_and_report();
}
