#include "core/bootstrap_wire.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace tutti::core {

bool FrameReader::feed(const uint8_t* data, size_t n, std::vector<Frame>* done) {
  if (failed_) return false;
  while (n > 0) {
    if (!inPayload_) {
      size_t take = std::min(n, sizeof(FrameHeader) - headerGot_);
      memcpy(reinterpret_cast<uint8_t*>(&header_) + headerGot_, data, take);
      headerGot_ += take;
      data += take;
      n -= take;
      if (headerGot_ < sizeof(FrameHeader)) return true;
      headerGot_ = 0;
      if (header_.magic != kFrameMagic) {
        failed_ = true;
        error_ = fmt::format("bad frame magic {:#x}", header_.magic);
        return false;
      }
      if (header_.bytes > kMaxControlMessageBytes) {
        failed_ = true;
        error_ = fmt::format("a frame of {} bytes announced (at most {} allowed)", header_.bytes,
                             kMaxControlMessageBytes);
        return false;
      }
      frame_.tag = header_.tag;
      frame_.payload.clear();
      inPayload_ = true;
    }
    size_t need = static_cast<size_t>(header_.bytes) - frame_.payload.size();
    size_t take = std::min(n, need);
    frame_.payload.insert(frame_.payload.end(), data, data + take);
    data += take;
    n -= take;
    if (frame_.payload.size() == header_.bytes) {
      done->push_back(std::move(frame_));
      frame_ = Frame();
      inPayload_ = false;
    }
  }
  return true;
}

}  // namespace tutti::core
