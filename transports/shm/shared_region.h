// A block of memory one process writes and the other processes of its node
// map read-only: a named POSIX shm object. PowerSGD's node members use it to
// read each other's inputs (src/capi/compress_api.cc) at the speed of a
// memory copy, where cross-memory attach pins and walks every page per call.
//
// Contract
// - create() makes a fresh object (O_EXCL, mode 0600) of `bytes`, reserves its
//   pages with posix_fallocate (a full /dev/shm fails here with a message, not
//   with SIGBUS on a later write) and maps it read-write. open() maps an
//   existing one read-only and checks its size.
// - The creator unlinks the name once every reader has opened it (unlink(),
//   idempotent; the destructor unlinks it too if still named), so no name
//   outlives the set-up. The mapping lives until the object is destroyed.
// - Ordering is the caller's: the writer's stores become visible to readers
//   through whatever message tells them to read (a collective here).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"

namespace tutti::transport::shm {

class SharedRegion {
 public:
  // A fresh name: "/tutti-<hash>-<what>-<rank>-<random>".
  static std::string makeName(uint64_t commHash, const char* what, int rank);
  static Result<std::unique_ptr<SharedRegion>> create(const std::string& name, size_t bytes);
  static Result<std::unique_ptr<SharedRegion>> open(const std::string& name, size_t bytes);
  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  uint8_t* data() { return static_cast<uint8_t*>(base_); }
  const uint8_t* data() const { return static_cast<const uint8_t*>(base_); }
  size_t size() const { return bytes_; }
  const std::string& name() const { return name_; }
  // Removes the name (creator only; a no-op after the first call).
  void unlink();

 private:
  SharedRegion(std::string name, void* base, size_t bytes, bool owner)
      : name_(std::move(name)), base_(base), bytes_(bytes), named_(owner) {}
  std::string name_;
  void* base_;
  size_t bytes_;
  bool named_;
};

}  // namespace tutti::transport::shm
