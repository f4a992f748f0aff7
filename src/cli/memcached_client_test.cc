// Unit tests of the memcached meta-protocol parser of `farmem bench channels`
// (bench/memcached_client.h): complete, partial and malformed replies; the client against a real
// memcached forked as a target process (skipped without the package). Test thread + client threads.
#include "memcached_client.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "objects_throughput_internal.h"
#include "redis_bench.h"

namespace farmem::bench {
namespace {

using Kind = MetaReply::Kind;

TEST(MemcachedParse, ValueMissStoredNoop) {
  auto r = ParseMetaReply("VA 5 f0\r\nhello\r\nEN\r\n");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->kind, Kind::kValue);
  EXPECT_EQ((*r)->value, "hello");
  EXPECT_EQ((*r)->consumed, 16u);  // the EN after it is left for the next call
  auto miss = ParseMetaReply("EN\r\n");
  ASSERT_TRUE(miss.ok() && miss->has_value());
  EXPECT_EQ((*miss)->kind, Kind::kMiss);
  auto hd = ParseMetaReply("HD\r\n");
  ASSERT_TRUE(hd.ok() && hd->has_value());
  EXPECT_EQ((*hd)->kind, Kind::kStored);
  auto mn = ParseMetaReply("MN\r\n");
  ASSERT_TRUE(mn.ok() && mn->has_value());
  EXPECT_EQ((*mn)->kind, Kind::kNoop);
  // A value may itself hold CR LF: the length, not a delimiter search, ends it.
  auto crlf = ParseMetaReply("VA 4\r\na\r\nb\r\n");
  ASSERT_TRUE(crlf.ok() && crlf->has_value());
  EXPECT_EQ((*crlf)->value, "a\r\nb");
}

TEST(MemcachedParse, IncompleteAsksForMore) {
  for (std::string partial :
       {"", "VA", "VA 5\r", "VA 5\r\nhel", "VA 5\r\nhello", "VA 5\r\nhello\r"}) {
    auto r = ParseMetaReply(partial);
    ASSERT_TRUE(r.ok()) << partial;
    EXPECT_FALSE(r->has_value()) << partial;
  }
}

TEST(MemcachedParse, MalformedAndErrorRepliesAreErrors) {
  for (std::string bad : {"VA 5\r\nhelloXY", "VA -1\r\n", "VA 5x\r\nhello\r\n", "VA\r\n", "VA \r\n",
                          "ERROR\r\n", "CLIENT_ERROR bad command line format\r\n",
                          "SERVER_ERROR out of memory\r\n", "NS\r\n", "XX\r\n"}) {
    auto r = ParseMetaReply(bad);
    EXPECT_FALSE(r.ok()) << bad;
  }
  EXPECT_FALSE(ParseMetaReply(std::string(2000, 'a')).ok());  // no CRLF within 1 KiB
}

TEST(MemcachedServer, MissingBinaryIsAClearError) {
  auto t = TargetProcess::Fork("memcached", MemcachedServerRole(""));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto msg = (*t)->Start(std::chrono::seconds(30));
  ASSERT_FALSE(msg.ok());
  EXPECT_NE(msg.status().ToString().find("memcached not found"), std::string::npos)
      << msg.status().ToString();
}

// Against a real default-config memcached (skipped when the Debian package is not installed):
// ms stores, mg returns the stored bytes, an absent key is a miss, a measured run checks values.
TEST(MemcachedServer, SetGetMissAndTimedGets) {
  const std::string path = FindOnPath("memcached");
  if (path.empty()) GTEST_SKIP() << "memcached not installed (Debian: apt-get install memcached)";
  auto t = TargetProcess::Fork("memcached", MemcachedServerRole(path));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto msg = (*t)->Start(std::chrono::seconds(30));
  ASSERT_TRUE(msg.ok() && msg->size() == sizeof(uint16_t)) << msg.status().ToString();
  uint16_t port;
  std::memcpy(&port, msg->data(), sizeof(port));
  ASSERT_TRUE(MemcachedLoad(port, 20, 32).ok());
  auto c = MemcachedConn::Connect(port);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto v = c->Get(RedisKey(7));
  ASSERT_TRUE(v.ok() && v->has_value()) << v.status().ToString();
  std::vector<std::byte> want(32);
  FillObjectValue(7, want);
  EXPECT_EQ(std::memcmp((*v)->data(), want.data(), want.size()), 0);
  auto miss = c->Get("no-such-key");
  ASSERT_TRUE(miss.ok()) << miss.status().ToString();
  EXPECT_FALSE(miss->has_value());
  // 25 keys over 20 loaded: the timed gets must report the misses as an error, not count them.
  EXPECT_FALSE(RunMemcachedGets(port, 25, 32, 2, 0.0, 0.05).ok());
  auto rate = RunMemcachedGets(port, 20, 32, 2, 0.0, 0.05);
  ASSERT_TRUE(rate.ok()) << rate.status().ToString();
  EXPECT_GT(*rate, 0.0);
  (*t)->Stop();
}

}  // namespace
}  // namespace farmem::bench
