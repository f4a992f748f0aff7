// Tests for Status/Result: codes, messages, context prefixes, the propagation macros and the
// checked failure of reading an error Result's value.
#include "farmem/status.h"

#include <cerrno>

#include <gtest/gtest.h>

namespace farmem {
namespace {

TEST(Status, OkIsCheapAndPrintsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), Code::kOk);
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_EQ(s.message(), "");
}

TEST(Status, ErrorKeepsCodeAndMessage) {
  Status s = Status::OutOfRange("offset 4096 past region end 4096");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_EQ(s.ToString(), "OutOfRange: offset 4096 past region end 4096");
  Status c = s.WithContext("read pool-1");
  EXPECT_EQ(c.code(), Code::kOutOfRange);
  EXPECT_EQ(c.message(), "read pool-1: offset 4096 past region end 4096");
}

TEST(Status, FromErrnoAddsSystemText) {
  Status s = Status::FromErrno("connect 127.0.0.1:1", ECONNREFUSED);
  EXPECT_EQ(s.code(), Code::kIoError);
  EXPECT_NE(s.message().find("refused"), std::string_view::npos) << s.ToString();
}

TEST(Status, OkCodeWithMessageIsStillOk) {
  EXPECT_TRUE(Status(Code::kOk, "ignored").ok());
}

Result<int> Half(int v) {
  if (v % 2) return Status::InvalidArgument("odd");
  return v / 2;
}

Result<int> Quarter(int v) {
  FARMEM_ASSIGN_OR_RETURN(int h, Half(v));
  return Half(h);
}

Status CheckEven(int v) {
  FARMEM_RETURN_IF_ERROR(Half(v).status());
  return Status::OK();
}

TEST(Result, ValueOrStatusAndMacros) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), Code::kInvalidArgument);
  EXPECT_FALSE(Quarter(3).ok());
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_EQ(CheckEven(5).message(), "odd");
}

TEST(Result, FromOkStatusIsAnInternalError) {
  Result<int> r = Status::OK();
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInternal);
}

struct Pair {
  int a = 0;
  int b = 0;
};

// Reading the value of an error Result is a checked failure (status printed, abort), never UB.
TEST(ResultDeathTest, ValueOfAnErrorAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Result<Pair> r = Status::NotFound("no such object");
  const Result<Pair>& cr = r;
  constexpr const char* kMsg = "Result value accessed on an error: NotFound: no such object";
  EXPECT_DEATH((void)r.value(), kMsg);
  EXPECT_DEATH((void)cr.value(), kMsg);
  EXPECT_DEATH((void)std::move(r).value(), kMsg);
  EXPECT_DEATH((void)*r, kMsg);
  EXPECT_DEATH((void)*cr, kMsg);
  EXPECT_DEATH((void)r->a, kMsg);
  EXPECT_DEATH((void)cr->b, kMsg);
  Result<Pair> ok = Pair{1, 2};
  EXPECT_EQ(ok->b, 2);
  EXPECT_EQ(ok.value().a, 1);
}

}  // namespace
}  // namespace farmem
