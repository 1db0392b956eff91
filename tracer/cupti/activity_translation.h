// Activity translation: CUPTI activity records -> GpuActivity and
// ExternalCorrelation values (gpu_activity.h).
//
// Design summary:
//  - translate_activity() looks at one record's kind: concurrent kernel (and
//    the serialized kernel kind, same layout), memcpy, and external
//    correlation of kind CUSTOM0 (the ids the op hooks push) are kept; every
//    other record (the runtime and driver API records CUPTI needs in order to
//    emit correlations, other external kinds) is counted as ignored.
//  - Pure: no CUPTI calls, so tests feed it zeroed CUPTI structs filled by
//    hand, without a GPU. The live source (cupti_source.h) walks a buffer
//    with cuptiActivityGetNextRecord and hands each record here.
//
// Note [Record versions]
// CUPTI versions its record structs (CUpti_ActivityKernel9, 10, ...) and
// writes the one of the CUPTI release in use. The fields read here (times,
// ids, bytes, copy kind) sit at the same offsets in every version since CUDA
// 12.0; activity_translation.cc checks that at compile time.
#pragma once

#include <cupti_activity.h>

#include <cstdint>
#include <vector>

#include "tracer/cupti/gpu_activity.h"

namespace spillway {

// What a run of records translated to, in record order.
struct TranslatedActivities {
  std::vector<GpuActivity> activities;
  std::vector<ExternalCorrelation> correlations;
  std::uint64_t ignored_records = 0;

  void clear() {
    activities.clear();
    correlations.clear();
    ignored_records = 0;
  }
};

// Appends what `record` says to `out`: an activity, a correlation, or one
// more ignored record.
void translate_activity(const CUpti_Activity& record, TranslatedActivities& out);

// CUPTI's copy kind (CUpti_ActivityMemcpyKind, stored as a byte) as a direction.
CopyDirection copy_direction(std::uint8_t cupti_copy_kind);

}  // namespace spillway
