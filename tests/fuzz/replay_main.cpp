// SPDX-License-Identifier: Apache-2.0
// Replays fuzz inputs without libFuzzer: every file of the directories named on the command
// line goes through the target once, so that every test build (g++ too) checks the seeds and
// the crashers found so far. Under a sanitizer it also fails on an allocation over 32 MiB, as
// scripts/fuzz tells libFuzzer to (-malloc_limit_mb=32).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

// From the sanitizer runtime when there is one (ASan, TSan), null otherwise: weak.
extern "C" int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void*,
                                                                             std::size_t),
                                                         void (*free_hook)(const volatile void*))
    __attribute__((weak));

namespace {

// Inputs are a few KiB: an allocation larger than this was sized by a length an input claimed
// (a header announcing 64 MiB), not by bytes it carried, and a peer must not be able to do that.
constexpr std::size_t malloc_limit = std::size_t{32} << 20;

void check_malloc(const volatile void*, std::size_t size) {
  if (size > malloc_limit) {
    std::fprintf(stderr, "allocation of %zu bytes, over the %zu MiB limit for fuzz inputs\n", size,
                 malloc_limit >> 20);
    std::abort();
  }
}

void ignore_free(const volatile void*) {}

}  // namespace

int main(int argc, char** argv) {
  if (__sanitizer_install_malloc_and_free_hooks != nullptr) {
    __sanitizer_install_malloc_and_free_hooks(check_malloc, ignore_free);
  }
  namespace fs = std::filesystem;
  std::size_t replayed = 0;
  for (int i = 1; i < argc; ++i) {
    const fs::path dir = argv[i];
    // regressions/<name>/ exists only once a crasher has been found for that target.
    if (!fs::is_directory(dir)) {
      std::printf("%s: no such directory, nothing to replay\n", argv[i]);
      continue;
    }
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.is_regular_file() && entry.path().filename().string().front() != '.') {
        files.push_back(entry.path());
      }
    }
    std::sort(files.begin(), files.end());  // the same order on every run
    for (const auto& file : files) {
      std::ifstream in(file, std::ios::binary);
      std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      // Named first, so that the last name printed is the input that crashed.
      std::printf("replaying %s (%zu bytes)\n", file.c_str(), bytes.size());
      std::fflush(stdout);
      LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
      ++replayed;
    }
  }
  if (replayed == 0) {
    // The seed corpus is never empty: nothing replayed means a wrong path, not a pass.
    std::fprintf(stderr, "no input replayed: is the seed corpus missing?\n");
    return 1;
  }
  std::printf("replayed %zu inputs, none crashed\n", replayed);
  return 0;
}
