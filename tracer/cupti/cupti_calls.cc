// The real CUPTI entry points (see cupti_calls.h).
#include "tracer/cupti/cupti_calls.h"

#include <dlfcn.h>

namespace spillway {
namespace {

bool cuda_driver_loadable() {
  // RTLD_NOLOAD first: a process that already runs CUDA has it, at no cost.
  void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (driver == nullptr) driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver == nullptr) return false;
  ::dlclose(driver);
  return true;
}

}  // namespace

const CuptiCalls& real_cupti_calls() {
  static const CuptiCalls calls{
      .subscribe = &cuptiSubscribe,
      .unsubscribe = &cuptiUnsubscribe,
      .register_callbacks = &cuptiActivityRegisterCallbacks,
      .enable = &cuptiActivityEnable,
      .disable = &cuptiActivityDisable,
      .push_external_id = &cuptiActivityPushExternalCorrelationId,
      .pop_external_id = &cuptiActivityPopExternalCorrelationId,
      .flush_all = &cuptiActivityFlushAll,
      .next_record = &cuptiActivityGetNextRecord,
      .result_string = &cuptiGetResultString,
      .driver_loadable = &cuda_driver_loadable,
  };
  return calls;
}

}  // namespace spillway
