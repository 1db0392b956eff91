/* spillway's C ABI: what torch.cuda.memory.CUDAPluggableAllocator loads.
 *
 *   allocator = torch.cuda.memory.CUDAPluggableAllocator(
 *       "libspillway.so", "spillway_malloc", "spillway_free")
 *   torch.cuda.memory.change_current_allocator(allocator)
 *
 * Contract (design section 3). No CUDA headers: streams are the cudaStream_t
 * handle passed as void* (NULL is the default stream). libspillway.so exports
 * these C functions and, for C++ users that must share its process runtime
 * (the hooks), spillway's own C++ namespace; nothing else (no fmt, std or
 * nlohmann instantiations).
 *
 * Activation. The first call that needs the allocator (spillway_malloc,
 * spillway_record_stream, spillway_stats_json) activates spillway once per
 * process, from the string given to spillway_configure if it was called, else
 * from the SPILLWAY_CONF environment variable (unset: defaults). Activation
 * builds the device (`device` key), the caching allocator (budget
 * `device_budget` of the device's memory, large slabs of `chunk_size`) and,
 * when `trace` is set, the trace recorder, whose file is completed at exit.
 * When activation fails (a bad SPILLWAY_CONF, `device:cuda` without a GPU)
 * nothing crashes: spillway_malloc returns NULL and spillway_last_error()
 * says why, naming the offending key; every later call fails the same way.
 *
 * Devices. spillway manages one device per process: device ordinal 0 (the
 * GPU CUDA numbers 0 in this process, i.e. the first of CUDA_VISIBLE_DEVICES;
 * with `device:sim`, the simulated device). A call naming another ordinal
 * fails (NULL, with an error).
 *
 * Errors. spillway_last_error() is per thread: the message of this thread's
 * most recent failed call, "" when none. Successful calls do not clear it.
 *
 * Thread safety: every function may be called from any thread.
 */
#ifndef SPILLWAY_SPILLWAY_H_
#define SPILLWAY_SPILLWAY_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SPILLWAY_API __attribute__((visibility("default")))
#else
#define SPILLWAY_API
#endif

/* At least `size` bytes of device memory usable on `stream`, or NULL on
 * failure (out of budget after spilling, activation failed, bad device): see
 * spillway_last_error(). size 0 gives NULL without an error. torch signature:
 * void*(size_t, int, cudaStream_t). */
SPILLWAY_API void* spillway_malloc(size_t size, int device, void* stream);

/* Gives back a pointer from spillway_malloc. `size`, `device` and `stream`
 * are those of the allocation (torch passes them; spillway looks the block
 * up by pointer). NULL is ignored. Unknown pointers are reported through
 * spillway_last_error() and a warning. torch signature:
 * void(void*, size_t, int, cudaStream_t). */
SPILLWAY_API void spillway_free(void* ptr, size_t size, int device, void* stream);

/* Returns cached, unused device memory (free slabs) to the device. Does not
 * activate spillway. */
SPILLWAY_API void spillway_empty_cache(void);

/* The block holding `ptr` is also used on `stream` (torch's record_stream):
 * its memory is not reused before the work queued on `stream` so far has
 * finished. torch signature: void(void*, cudaStream_t). */
SPILLWAY_API void spillway_record_stream(void* ptr, void* stream);

/* Sets the configuration ("key:value,key:value", SPILLWAY_CONF's syntax) used
 * at activation, instead of SPILLWAY_CONF. Returns 0 on success; non-zero when
 * the string is invalid (spillway_last_error() names the key, the value and
 * the accepted form) or spillway is already active with a different
 * configuration: configuration is read once, before the first allocation.
 * Calling it again with the active configuration's exact text returns 0. */
SPILLWAY_API int spillway_configure(const char* conf);

/* Writes the statistics (PyTorch's key names, e.g.
 * "allocated_bytes.all.current", plus spillway's own) as one NUL-terminated
 * JSON object into `buffer` (at most `size` bytes, truncated if need be) and
 * returns the JSON's length without the NUL, so
 *   size_t n = spillway_stats_json(NULL, 0);  then a buffer of n + 1 bytes
 * fits. Activates spillway; on failure writes "" and returns 0. */
SPILLWAY_API size_t spillway_stats_json(char* buffer, size_t size);

/* This thread's last error message; "" when none. Valid until this thread's
 * next spillway call. */
SPILLWAY_API const char* spillway_last_error(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SPILLWAY_SPILLWAY_H_ */
