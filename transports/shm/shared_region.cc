#include "transports/shm/shared_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <random>

#include "base/log.h"

namespace tutti::transport::shm {

std::string SharedRegion::makeName(uint64_t commHash, const char* what, int rank) {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return fmt::format("/tutti-{:016x}-{}-{}-{:016x}", commHash, what, rank, r);
}

Result<std::unique_ptr<SharedRegion>> SharedRegion::create(const std::string& name, size_t bytes) {
  const std::string who = fmt::format("SHM: region {} ({} bytes)", name, bytes);
  if (bytes == 0) return invalidArgument(who + ": empty");
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return errnoError(who + ": shm_open", errno);
  auto undo = [&](int err, const std::string& what) {
    close(fd);
    shm_unlink(name.c_str());
    return errnoError(who + ": " + what, err);
  };
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) return undo(errno, "ftruncate");
  int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err != 0 && err != EINVAL && err != EOPNOTSUPP)
    return undo(err, "reserving its pages in /dev/shm (is it large enough?)");
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return undo(errno, "mmap");
  close(fd);
  return std::unique_ptr<SharedRegion>(new SharedRegion(name, base, bytes, true));
}

Result<std::unique_ptr<SharedRegion>> SharedRegion::open(const std::string& name, size_t bytes) {
  const std::string who = fmt::format("SHM: region {} ({} bytes)", name, bytes);
  int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return errnoError(who + ": shm_open", errno);
  struct stat sb {};
  if (fstat(fd, &sb) != 0 || static_cast<uint64_t>(sb.st_size) < bytes) {
    close(fd);
    return remoteError(who + ": smaller than announced");
  }
  void* base = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (base == MAP_FAILED) return errnoError(who + ": mmap", err);
  return std::unique_ptr<SharedRegion>(new SharedRegion(name, base, bytes, false));
}

void SharedRegion::unlink() {
  if (named_) shm_unlink(name_.c_str());
  named_ = false;
}

SharedRegion::~SharedRegion() {
  unlink();
  munmap(base_, bytes_);
}

}  // namespace tutti::transport::shm
