// SharedRegion (LOCO's shared_region): a slice of `bytes` in every member's channel region, read
// and written one-sided at an offset in any member's copy. A handle is used by one thread at a
// time; its local copy is also written by the transport's progress thread (remote writes).
//
// Invariant: nothing is posted unless [offset, offset + len) lies inside the region and `node` is
// a member whose slice is known, so a bad call is a Status and never a transport access outside
// the slice (which the transport would only catch at the end of the whole channel region).
#include <algorithm>
#include <string>

#include "channels/manager_impl.h"

namespace farmem::channels {

Result<SharedRegion> SharedRegion::Open(ChannelThread& thread, std::string name,
                                        std::vector<NodeId> members, size_t bytes) {
  if (bytes == 0) return Status::InvalidArgument("shared region '" + name + "': size 0");
  // Checked here: the slice allocator rounds the size up, which would wrap for sizes near 2^64.
  const size_t limit = thread.manager().config().region_bytes;
  if (bytes > limit) {
    return Status::InvalidArgument("shared region '" + name + "': " + std::to_string(bytes) +
                                   " bytes exceed the channel region (" + std::to_string(limit) +
                                   " bytes)");
  }
  auto ch = Channel::Open(thread, std::move(name), std::move(members), bytes);
  if (!ch.ok()) return ch.status();
  SharedRegion r;
  r.ch_ = std::move(*ch);
  r.size_ = bytes;
  return r;
}

Result<uint64_t> SharedRegion::target(NodeId node, uint64_t offset, size_t len,
                                      const char* op) const {
  // The message is built on the error paths only (this runs on every operation).
  auto what = [&] { return std::string("shared region '") + ch_.name() + "' " + op; };
  if (len == 0) {
    // 0-length ops complete locally on libfabric without reaching the peer: never useful.
    return Status::InvalidArgument(what() + ": 0 bytes");
  }
  const auto& members = ch_.members();
  if (!std::binary_search(members.begin(), members.end(), node)) {
    return Status::InvalidArgument(what() + ": node " + std::to_string(node) + " is not a member");
  }
  if (offset > size_ || len > size_ - offset) {
    return Status::OutOfRange(what() + ": [" + std::to_string(offset) + ", +" +
                              std::to_string(len) + ") is outside the region's " +
                              std::to_string(size_) + " bytes");
  }
  auto base = ch_.slice_offset(node);
  if (!base.ok()) return base.status();
  return *base + offset;
}

Result<AckKey> SharedRegion::write(ChannelThread& thread, NodeId node, uint64_t offset,
                                   std::span<const std::byte> src) {
  auto at = target(node, offset, src.size(), "write");
  if (!at.ok()) return at.status();
  return thread.write(node, *at, src.data(), src.size());
}

Result<AckKey> SharedRegion::read(ChannelThread& thread, NodeId node, uint64_t offset,
                                  std::span<std::byte> dst) {
  auto at = target(node, offset, dst.size(), "read");
  if (!at.ok()) return at.status();
  return thread.read(node, *at, dst.data(), dst.size());
}

std::span<std::byte> SharedRegion::local() const {
  return {ch_.local_slice(), size_};
}

}  // namespace farmem::channels
