// The memcached baseline of `farmem bench channels` (kvstore gets): a default-config memcached
// started on a free loopback port by a forked target process, and a small blocking client of the
// meta text protocol (`ms` to load, `mg <key> v` to read). One MemcachedConn per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "farmem/status.h"
#include "target_process.h"

namespace farmem::bench {

// One reply of the meta protocol (docs: memcached protocol.txt, "Meta Commands"), as read off
// the wire: a status line "<CC> [flags]\r\n", and for VA a data block "<len bytes>\r\n".
struct MetaReply {
  enum class Kind { kValue, kMiss, kStored, kNoop };
  Kind kind = Kind::kMiss;
  std::string value;    // kValue only
  size_t consumed = 0;  // bytes of the buffer this reply used
};

// Parses the first reply in `buf`. nullopt: incomplete, read more. VA = value, EN = miss, HD =
// stored, MN = noop; memcached's error lines (ERROR, CLIENT_ERROR, SERVER_ERROR, NS, EX, NF) and
// anything malformed (no CRLF within 1 KiB, a bad length, a data block not ended by CRLF) are
// errors, so a desynchronised stream never yields a value.
Result<std::optional<MetaReply>> ParseMetaReply(std::string_view buf);

// A blocking connection to `host` (an IPv4 address):`port`; every call returns within 5 s
// (socket timeouts).
class MemcachedConn {
 public:
  static Result<MemcachedConn> Connect(uint16_t port, const std::string& host = "127.0.0.1");
  MemcachedConn(MemcachedConn&& o) noexcept : fd_(o.fd_), buf_(std::move(o.buf_)) { o.fd_ = -1; }
  MemcachedConn& operator=(MemcachedConn&&) = delete;
  MemcachedConn(const MemcachedConn&) = delete;
  ~MemcachedConn();

  Status Set(std::string_view key, std::span<const std::byte> value);  // ms <key> <len> T0
  Result<std::optional<std::string>> Get(std::string_view key);        // mg <key> v; nullopt = miss
  Status Noop();                                                       // mn

 private:
  explicit MemcachedConn(int fd) : fd_(fd) {}
  Status Send(std::string_view bytes);
  Result<MetaReply> Receive();
  int fd_ = -1;
  std::string buf_;  // received bytes not yet parsed
};

// Child role: runs `memcached` (found on PATH; Debian package memcached) with its default
// configuration, only bound to 127.0.0.1 on a free port (plus `-u root` when run as root, which
// memcached demands), waits until it answers `mn`, reports the port (2 bytes), and stops it when
// the parent stops this target. Fails clearly when memcached is not installed. `extra_listen`: one
// more address it listens on (the namespace benchmark's bridge address).
TargetRole MemcachedServerRole(std::string memcached, std::string extra_listen = "");

// SETs keys RedisKey(0..count-1) to FillObjectValue(index) of `value_size` bytes.
Status MemcachedLoad(uint16_t port, uint64_t count, size_t value_size);

// `clients` threads, one connection and one `mg` in flight each, uniform keys over `count`;
// every value is checked. Returns completed gets per second over `seconds` after `warmup_s`.
Result<double> RunMemcachedGets(uint16_t port, uint64_t count, size_t value_size, int clients,
                                double warmup_s, double seconds,
                                const std::string& host = "127.0.0.1");

}  // namespace farmem::bench
