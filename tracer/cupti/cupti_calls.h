// CuptiCalls: the CUPTI entry points the live source uses, as one table of
// function pointers, so that tests can stand in for CUPTI (a subscriber that
// is already taken, a buffer of hand-made records) on a machine without a GPU.
//
// real_cupti_calls() is libcupti itself. The table is this narrow on purpose:
// the source must not reach CUPTI any other way.
#pragma once

#include <cupti.h>

#include <cstddef>
#include <cstdint>

namespace spillway {

struct CuptiCalls {
  CUptiResult (*subscribe)(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc callback,
                           void* user_data);
  CUptiResult (*unsubscribe)(CUpti_SubscriberHandle subscriber);
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc buffer_requested,
                                    CUpti_BuffersCallbackCompleteFunc buffer_completed);
  CUptiResult (*enable)(CUpti_ActivityKind kind);
  CUptiResult (*disable)(CUpti_ActivityKind kind);
  CUptiResult (*push_external_id)(CUpti_ExternalCorrelationKind kind, std::uint64_t id);
  CUptiResult (*pop_external_id)(CUpti_ExternalCorrelationKind kind, std::uint64_t* last_id);
  CUptiResult (*flush_all)(std::uint32_t flag);
  CUptiResult (*next_record)(std::uint8_t* buffer, std::size_t valid_bytes,
                             CUpti_Activity** record);
  CUptiResult (*result_string)(CUptiResult result, const char** text);
  // Whether the CUDA driver library can be loaded: only to word a failure.
  bool (*driver_loadable)();
};

const CuptiCalls& real_cupti_calls();

}  // namespace spillway
