// CuptiMode: how op GPU timing uses CUPTI (the `cupti` key of SPILLWAY_CONF,
// docs/configuration.md). Here, below the allocator's configuration, so the
// CUPTI source depends on nothing above tracer/.
#pragma once

namespace spillway {

enum class CuptiMode {
  auto_select,  // CUPTI where it can be used, else the wall clock (one warning)
  on,           // CUPTI or an error saying why not
  off,          // the wall clock; CUPTI is never touched
};

}  // namespace spillway
