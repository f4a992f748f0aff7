// Unit tests of the memcached meta-protocol parser of `farmem bench channels`
// (bench/memcached_client.h): complete, partial and malformed replies. Single-threaded, no server.
#include "memcached_client.h"

#include <gtest/gtest.h>

#include <string>

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

}  // namespace
}  // namespace farmem::bench
