// Replays inputs through a fuzz target without libFuzzer: the main() of the
// fuzz targets in a build with TUTTI_FUZZ off (GCC, the normal build), so
// that ctest fuzz.replay.<name> runs every target over its seed corpus.
//
// usage: fuzz_<name> PATH...  (a directory: every regular file in it, in
// name order; a file: that file). Exit 0 once every input ran; 2 on a usage
// error, an unreadable path or no input at all. A violated invariant traps
// (the test then fails on the signal); sanitizer builds report as usual.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

bool listInputs(const std::string& path, std::vector<std::string>* out) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return false;
  if (!S_ISDIR(st.st_mode)) {
    out->push_back(path);
    return true;
  }
  DIR* d = opendir(path.c_str());
  if (!d) return false;
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    std::string file = path + "/" + e->d_name;
    struct stat fst {};
    if (stat(file.c_str(), &fst) == 0 && S_ISREG(fst.st_mode)) names.push_back(file);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  out->insert(out->end(), names.begin(), names.end());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    if (!listInputs(argv[i], &inputs)) {
      std::fprintf(stderr, "%s: cannot read %s\n", argv[0], argv[i]);
      return 2;
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "%s: no inputs found\n", argv[0]);
    return 2;
  }
  for (const auto& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "%s: cannot read %s\n", argv[0], path.c_str());
      return 2;
    }
    std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
    std::fprintf(stderr, "replaying %s (%zu bytes)\n", path.c_str(), data.size());
    static const uint8_t kNothing = 0;  // libFuzzer never passes a null pointer either
    LLVMFuzzerTestOneInput(data.empty() ? &kNothing : data.data(), data.size());
  }
  std::printf("%s: %zu inputs replayed, no invariant violated\n", argv[0], inputs.size());
  return 0;
}
