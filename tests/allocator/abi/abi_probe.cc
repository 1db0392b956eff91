// abi_probe: loads libspillway.so with dlopen in a fresh process and prints
// what the C ABI did, for abi_tests to check. One mode per run:
//
//   abi_probe malloc         spillway_malloc(1 MiB) once, then free; prints
//                            "ptr=<null|ok> error=<spillway_last_error()>"
//   abi_probe churn N        N malloc/free pairs of assorted sizes, then exits
//                            without any explicit flush (the trace, if
//                            SPILLWAY_CONF sets one, is completed at exit);
//                            dlcloses the library and prints whether it is
//                            still loaded (it pins itself)
//
// SPILLWAY_CONF comes from the environment the test sets up.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

template <typename Function>
Function* find(void* library, const char* name) {
  void* symbol = dlsym(library, name);
  if (symbol == nullptr) {
    std::printf("missing symbol %s\n", name);
    std::exit(2);
  }
  return reinterpret_cast<Function*>(symbol);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: abi_probe malloc | churn N\n");
    return 2;
  }
  void* library = dlopen(SPILLWAY_LIBRARY_PATH, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    std::printf("dlopen failed: %s\n", dlerror());
    return 2;
  }
  auto* malloc_fn = find<void*(std::size_t, int, void*)>(library, "spillway_malloc");
  auto* free_fn = find<void(void*, std::size_t, int, void*)>(library, "spillway_free");
  auto* last_error_fn = find<const char*()>(library, "spillway_last_error");

  const std::string mode = argv[1];
  if (mode == "malloc") {
    void* ptr = malloc_fn(1 << 20, 0, nullptr);
    std::printf("ptr=%s error=%s\n", ptr ? "ok" : "null", last_error_fn());
    if (ptr) free_fn(ptr, 1 << 20, 0, nullptr);
    return 0;
  }
  if (mode == "churn" && argc == 3) {
    const int pairs = std::atoi(argv[2]);
    for (int i = 0; i < pairs; ++i) {
      const std::size_t size = 512 + static_cast<std::size_t>(i % 7) * 100'000;
      void* ptr = malloc_fn(size, 0, nullptr);
      if (ptr == nullptr) {
        std::printf("malloc failed: %s\n", last_error_fn());
        return 1;
      }
      std::memset(ptr, 0x5A, size);
      free_fn(ptr, size, 0, nullptr);
    }
    // dlclose must not unload the library (it pins itself); the exit handler
    // still runs and completes the trace.
    dlclose(library);
    const bool still_loaded = dlopen(SPILLWAY_LIBRARY_PATH, RTLD_NOW | RTLD_NOLOAD) != nullptr;
    std::printf("done, still loaded after dlclose: %s\n", still_loaded ? "yes" : "no");
    return 0;
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
