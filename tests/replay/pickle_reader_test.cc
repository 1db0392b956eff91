// The pickle reader: plain data in, every code-running opcode refused with
// its name and offset, and hostile input (truncation, unknown opcodes, deep
// nesting, huge lengths, cycles, mutations) answered with an error, never a
// crash (Note [A pickle reader that runs no code]).
#include "tools/replay/pickle_reader.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/replay/pickle_test_encoder.h"

namespace spillway {
namespace {

using Kind = PickleValue::Kind;
using namespace test_pickle;

std::string bytes(std::initializer_list<int> values) {
  std::string out;
  for (const int v : values) out += static_cast<char>(v);
  return out;
}

// {'a': [1, -2, 300, 2**40, -(2**40), 1.5, True, False, None, 'xyz', b'\0\1', (7, 8)],
//  'b': <the same list, through the memo>, 'c': frozenset(), 'd': {1: 2}}
// as protocol 4 would write it (FRAME, MEMOIZE, SHORT_BINUNICODE, ...).
std::string plain_data_pickle() {
  std::string p = bytes({0x80, 4, 0x95}) + le(0, 8);  // PROTO 4, FRAME (length not enforced)
  p += "}" + bytes({0x94});                           // EMPTY_DICT MEMOIZE (memo 0)
  p += "(" + bytes({0x8c, 1}) + "a" + bytes({0x94});  // MARK 'a' MEMOIZE (memo 1)
  p += "]" + bytes({0x94});                           // EMPTY_LIST MEMOIZE (memo 2)
  p += "(";
  p += "K" + bytes({1});                                     // BININT1 1
  p += "J" + le(static_cast<std::uint32_t>(-2), 4);          // BININT -2
  p += "M" + le(300, 2);                                     // BININT2 300
  p += bytes({0x8a, 6}) + le(std::uint64_t{1} << 40, 6);     // LONG1 2**40
  p += bytes({0x8a, 6}) + le(-(std::int64_t{1} << 40), 6);   // LONG1 -(2**40)
  p += "G" + bytes({0x3f, 0xf8, 0, 0, 0, 0, 0, 0});          // BINFLOAT 1.5 (big-endian)
  p += bytes({0x88, 0x89}) + "N";                            // NEWTRUE NEWFALSE NONE
  p += bytes({0x8c, 3}) + "xyz";                             // SHORT_BINUNICODE
  p += "C" + bytes({2, 0, 1});                               // SHORT_BINBYTES
  p += "K" + bytes({7}) + "K" + bytes({8}) + bytes({0x86});  // TUPLE2
  p += "e";                                                  // APPENDS
  p += bytes({0x8c, 1}) + "b" + "h" + bytes({2});            // 'b' BINGET 2
  p += bytes({0x8c, 1}) + "c" + "(" + bytes({0x91});         // 'c' MARK FROZENSET
  p += bytes({0x8c, 1}) + "d" + "}" + "K" + bytes({1}) + "K" + bytes({2}) + "s";  // SETITEM
  p += "u.";                                                                      // SETITEMS STOP
  return p;
}

TEST(replay_PickleReader, ReadsPlainData) {
  const PickleReadResult read = read_pickle(plain_data_pickle());
  ASSERT_TRUE(read.ok()) << read.error;
  const PickleDocument& doc = read.document;
  ASSERT_EQ(doc.kind(doc.root()), Kind::dict);
  const PickleRef* a = doc.find(doc.root(), "a");
  ASSERT_NE(a, nullptr);
  const auto& items = doc.items(*a);
  ASSERT_EQ(items.size(), 12u);
  EXPECT_EQ(doc.integer(items[0]), 1);
  EXPECT_EQ(doc.integer(items[1]), -2);
  EXPECT_EQ(doc.integer(items[2]), 300);
  EXPECT_EQ(doc.integer(items[3]), std::int64_t{1} << 40);
  EXPECT_EQ(doc.integer(items[4]), -(std::int64_t{1} << 40));
  EXPECT_EQ(doc.kind(items[5]), Kind::floating);
  EXPECT_EQ(doc.number(items[5]), 1.5);
  EXPECT_EQ(doc.kind(items[6]), Kind::boolean);
  EXPECT_EQ(doc.integer(items[6]), 1);
  EXPECT_EQ(doc.integer(items[7]), 0);
  EXPECT_EQ(doc.kind(items[8]), Kind::none);
  EXPECT_EQ(doc.text(items[9]), "xyz");
  EXPECT_EQ(doc.kind(items[10]), Kind::bytes);
  EXPECT_EQ(doc.text(items[10]), std::string("\0\1", 2));
  ASSERT_EQ(doc.kind(items[11]), Kind::tuple);
  ASSERT_EQ(doc.items(items[11]).size(), 2u);
  EXPECT_EQ(doc.integer(doc.items(items[11])[1]), 8);
  // 'b' is the same list (the memo shares it, as in Python).
  const PickleRef* b = doc.find(doc.root(), "b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(*b, *a);
  EXPECT_EQ(doc.kind(*doc.find(doc.root(), "c")), Kind::set);
  const PickleRef d = *doc.find(doc.root(), "d");
  ASSERT_EQ(doc.items(d).size(), 2u);
  EXPECT_EQ(doc.integer(doc.items(d)[1]), 2);
  EXPECT_EQ(doc.find(doc.root(), "missing"), nullptr);
  EXPECT_EQ(doc.find(*a, "a"), nullptr);  // not a dict
}

TEST(replay_PickleReader, LaterKeysWinAsInAPythonDict) {
  const PickleReadResult read =
      read_pickle(pickle(dict({str("k"), integer(1), str("k"), integer(2)})));
  ASSERT_TRUE(read.ok()) << read.error;
  EXPECT_EQ(read.document.integer(*read.document.find(read.document.root(), "k")), 2);
}

// Note [Large dicts are indexed]: a dict of many keys finds as a small one
// does, the last of a repeated key included.
TEST(replay_PickleReader, ALargeDictFindsEveryKeyAndTheLastOfARepeat) {
  std::string items;  // dict()'s encoding, built in a loop
  for (int i = 0; i < 100; ++i) items += str("key" + std::to_string(i)) + integer(i);
  items += str("key7") + integer(700);
  const PickleReadResult read = read_pickle(pickle("}(" + items + "u"));
  ASSERT_TRUE(read.ok()) << read.error;
  const PickleDocument& document = read.document;
  for (int i = 0; i < 100; ++i) {
    const PickleRef* found = document.find(document.root(), "key" + std::to_string(i));
    ASSERT_NE(found, nullptr) << i;
    EXPECT_EQ(document.integer(*found), i == 7 ? 700 : i);
  }
  EXPECT_EQ(document.find(document.root(), "key100"), nullptr);
}

TEST(replay_PickleReader, RefusesEveryOpcodeThatNamesOrNeedsCode) {
  struct Case {
    std::string body;  // after PROTO 2
    std::size_t offset;
    const char* error;
  };
  const Case cases[] = {
      {"ccollections\nOrderedDict\n", 2, "GLOBAL (opcode 0x63) names collections.OrderedDict"},
      {bytes({0x8c, 2}) + "os" + bytes({0x8c, 6}) + "system" + bytes({0x93}), 14,
       "STACK_GLOBAL (opcode 0x93) names os.system"},
      {"N)R", 4, "REDUCE (opcode 0x52)"},
      {"N}b", 4, "BUILD (opcode 0x62)"},
      {"(ios\nsystem\n", 3, "INST (opcode 0x69)"},
      {"(No", 4, "OBJ (opcode 0x6f)"},
      {"N)" + bytes({0x81}), 4, "NEWOBJ (opcode 0x81)"},
      {"N)}" + bytes({0x92}), 5, "NEWOBJ_EX (opcode 0x92)"},
      {bytes({0x82, 1}), 2, "EXT1 (opcode 0x82)"},
      {bytes({0x83, 1, 0}), 2, "EXT2 (opcode 0x83)"},
      {bytes({0x84, 1, 0, 0, 0}), 2, "EXT4 (opcode 0x84)"},
      {"P1\n", 2, "PERSID (opcode 0x50)"},
      {"NQ", 3, "BINPERSID (opcode 0x51)"},
  };
  for (const Case& c : cases) {
    const PickleReadResult read = read_pickle("\x80\x02" + c.body + ".");
    ASSERT_FALSE(read.ok()) << c.error;
    EXPECT_TRUE(read.error.starts_with("byte offset " + std::to_string(c.offset) + ": " + c.error))
        << read.error << "\nexpected: " << c.error;
    EXPECT_NE(read.error.find("refers to a class or function"), std::string::npos) << read.error;
  }
}

TEST(replay_PickleReader, ErrorsNameTheOffset) {
  struct Case {
    std::string data;
    const char* error;
  };
  const Case cases[] = {
      {"", "byte offset 0: empty file"},
      {"}.", "byte offset 0: not a pickle of protocol 2 or later"},
      {"\x80\x01N.", "byte offset 0: PROTO: protocol 1"},
      {"\x80\x02N" + bytes({0xff}), "byte offset 3: unknown opcode 0xff"},
      {"\x80\x02N", "byte offset 3: file ends without STOP"},
      {"\x80\x02X" + le(10, 4) + "abc", "byte offset 2: BINUNICODE: file ends inside the opcode"},
      {"\x80\x02" + bytes({0x8d}) + le(std::uint64_t{1} << 60, 8),
       "byte offset 2: BINUNICODE8: a string of"},
      {"\x80\x02" + bytes({0x8a, 9}) + le(1, 8) + bytes({1}),
       "byte offset 2: LONG1: an integer wider than 64 bits"},
      {"\x80\x02h" + bytes({5}) + ".", "byte offset 2: BINGET: memo entry 5 was never stored"},
      {"\x80\x02}K" + bytes({1}) + "a.",
       "byte offset 5: APPEND: adds items to a dict, not to a list"},
      {"\x80\x02N.", ""},  // fine
      {"\x80\x02"
       "e.",
       "byte offset 2: APPENDS: no MARK to pop to"},
      {"\x80\x02(N.", ""},  // an open MARK at STOP is tolerated, as in CPython
      {"\x80\x02.", "byte offset 2: STOP: STOP with an empty stack"},
      {"\x80\x02I1\n.", "byte offset 2: INT: INT is a protocol 0 text opcode"},
      {"\x80\x02" + bytes({0x97}),
       "byte offset 2: NEXT_BUFFER: NEXT_BUFFER refers to an out-of-band"},
  };
  for (const Case& c : cases) {
    const PickleReadResult read = read_pickle(c.data);
    if (std::string(c.error).empty()) {
      EXPECT_TRUE(read.ok()) << read.error;
      continue;
    }
    ASSERT_FALSE(read.ok()) << c.error;
    EXPECT_TRUE(read.error.starts_with(c.error)) << read.error << "\nexpected: " << c.error;
  }
}

TEST(replay_PickleReader, EveryTruncationIsAnErrorAtOrBeforeTheCut) {
  const std::string whole = plain_data_pickle();
  for (std::size_t size = 0; size < whole.size(); ++size) {
    const PickleReadResult read = read_pickle(whole.substr(0, size));
    ASSERT_FALSE(read.ok()) << "cut at " << size;
    const std::size_t offset = std::stoul(read.error.substr(std::string("byte offset ").size()));
    EXPECT_LE(offset, size) << read.error;
  }
}

TEST(replay_PickleReader, NestingAndSizeAreBounded) {
  PickleLimits limits;
  limits.max_mark_depth = 50;
  const std::string deep = "\x80\x02" + std::string(51, '(') + "N.";
  PickleReadResult read = read_pickle(deep, limits);
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(read.error.starts_with("byte offset 52: MARK: MARKs nested deeper than 50"))
      << read.error;

  limits = PickleLimits{};
  limits.max_values = 3;
  read = read_pickle("\x80\x02NNNN.", limits);
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(read.error.starts_with("byte offset 5: NONE: more than 3 values")) << read.error;
}

// A list that contains itself (through the memo) and a chain a million
// lists deep built with a stack of two: both read, and the document is
// destroyed without recursion.
TEST(replay_PickleReader, CyclesAndDeepChainsAreHarmless) {
  PickleReadResult read = read_pickle("\x80\x02]q" + bytes({0}) + "h" + bytes({0}) + "a.");
  ASSERT_TRUE(read.ok()) << read.error;
  const PickleRef root = read.document.root();
  ASSERT_EQ(read.document.items(root).size(), 1u);
  EXPECT_EQ(read.document.items(root)[0], root);

  std::string chain = "\x80\x02]" + bytes({0x94});  // memo 0
  constexpr int kDepth = 1'000'000;
  for (int i = 1; i <= kDepth; ++i) {
    // BINGET/LONG_BINGET i-1, EMPTY_LIST, MEMOIZE (memo i), APPEND, POP
    chain += "j" + le(i - 1, 4) + "]" + bytes({0x94}) + "a0";
  }
  chain += ".";
  read = read_pickle(chain);
  ASSERT_TRUE(read.ok()) << read.error;
  PickleRef at = read.document.root();
  int depth = 0;
  while (!read.document.items(at).empty()) {
    at = read.document.items(at)[0];
    ++depth;
  }
  EXPECT_EQ(depth, kDepth);
}

// Every single-byte change of a valid pickle reads or fails with an offset.
TEST(replay_PickleReader, MutatedPicklesNeverCrash) {
  const std::string whole = plain_data_pickle();
  int failures = 0;
  for (std::size_t i = 0; i < whole.size(); ++i) {
    for (const int value : {0x00, 0x28, 0x2e, 0x4a, 0x58, 0x65, 0x75, 0x8d, 0x94, 0xff}) {
      std::string mutated = whole;
      mutated[i] = static_cast<char>(value);
      const PickleReadResult read = read_pickle(mutated);
      if (!read.ok()) {
        ++failures;
        EXPECT_TRUE(read.error.starts_with("byte offset ")) << read.error;
      }
    }
  }
  EXPECT_GT(failures, 0);
}

// Any PROTO opcode first is a pickle: a version the reader does not take is
// its error ("protocol 6 (this reader takes 2 to 5)"), not a CSV line of
// binary bytes.
TEST(replay_PickleReader, LooksLikePickle) {
  EXPECT_TRUE(looks_like_pickle("\x80\x04\x95"));
  EXPECT_TRUE(looks_like_pickle("\x80\x02"));
  EXPECT_TRUE(looks_like_pickle("\x80\x06"));
  EXPECT_TRUE(looks_like_pickle("\x80"));
  EXPECT_FALSE(looks_like_pickle("SPWTRACE"));
  EXPECT_FALSE(looks_like_pickle("alloc,0x1,10"));
  EXPECT_FALSE(looks_like_pickle(""));
  const PickleReadResult read = read_pickle(std::string("\x80\x06}.", 4));
  EXPECT_NE(read.error.find("byte offset 0: PROTO: protocol 6 (this reader takes 2 to 5)"),
            std::string::npos)
      << read.error;
}

}  // namespace
}  // namespace spillway
