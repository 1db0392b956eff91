// PickleDocument: a Python pickle of plain data (dicts, lists, tuples, sets,
// str, bytes, int, float, bool, None), read without running any of it.
//
// Note [A pickle reader that runs no code]
// A pickle is a program for a stack machine; Python's unpickler imports and
// calls whatever its GLOBAL/REDUCE/BUILD/... opcodes name, so loading an
// untrusted file runs arbitrary code. PyTorch's memory snapshots
// (torch.cuda.memory._dump_snapshot) are pickles of plain dicts and lists,
// so this reader interprets only the opcodes that build plain data (protocols
// 2 to 5) and rejects every opcode that names a class or function, or needs
// one (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX,
// EXT1/2/4, PERSID, BINPERSID, out-of-band buffers), with its name and byte
// offset. Hostile input must not crash it: every length is checked against
// the bytes left before anything is allocated, integers wider than 64 bits
// are refused, MARK nesting and the number of values are bounded, and
// values live in one flat table referenced by index (no recursion, no
// shared pointers), so cycles and deep nesting built through the memo cost
// nothing when the document is walked by path or destroyed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace spillway {

// Index of a value in its PickleDocument.
using PickleRef = std::uint32_t;

// One value, 16 bytes: `payload` is a boolean's or integer's value, a
// float's bits, a string's or bytes' offset into the document's bytes, or a
// container's index into its item lists.
struct PickleValue {
  enum class Kind : std::uint8_t {
    none,
    boolean,
    integer,
    floating,
    string,
    bytes,
    list,
    tuple,
    dict,
    set
  };
  Kind kind = Kind::none;
  std::uint32_t length = 0;  // string and bytes
  std::int64_t payload = 0;
};

class PickleDocument {
 public:
  PickleRef root() const { return root_; }
  const PickleValue& value(PickleRef ref) const { return values_[ref]; }
  PickleValue::Kind kind(PickleRef ref) const { return values_[ref].kind; }
  // A boolean's or integer's value; 0 for other kinds.
  std::int64_t integer(PickleRef ref) const;
  // A float's value, or an integer's as a double; 0 for other kinds.
  double number(PickleRef ref) const;
  // A string or bytes value's contents; empty for other kinds.
  std::string_view text(PickleRef ref) const;
  // A list, tuple or set's items; a dict's keys and values, alternating.
  // Empty for other kinds.
  const std::vector<PickleRef>& items(PickleRef ref) const;
  // The value under string key `key` in dict `dict` (the last one, as in a
  // Python dict built by repeated SETITEM); nullptr when absent or when
  // `dict` is not a dict.
  const PickleRef* find(PickleRef dict, std::string_view key) const;

  // "a dict", "an integer", ... for messages.
  static std::string_view describe(PickleValue::Kind kind);

 private:
  friend class PickleParser;
  std::string bytes_;  // the file, which strings point into
  std::vector<PickleValue> values_;
  std::vector<std::vector<PickleRef>> containers_;
  PickleRef root_ = 0;
  // Note [Large dicts are indexed]: per dict of more than kIndexedDictKeys
  // keys, its string keys' last positions, built at the first find.
  static constexpr std::size_t kIndexedDictKeys = 16;
  mutable std::unordered_map<PickleRef, std::unordered_map<std::string_view, std::size_t>>
      dict_index_;
};

struct PickleLimits {
  std::size_t max_mark_depth = 1000;             // MARKs open at once
  std::size_t max_values = 1u << 31;             // values in the document
  std::size_t max_stack = std::size_t{1} << 28;  // items on the stack at once
};

struct PickleReadResult {
  PickleDocument document;
  std::string error;  // non-empty on failure: "byte offset N: ..."
  bool ok() const { return error.empty(); }
};

// True when `bytes` starts like a pickle of protocol 2 or later: PROTO
// (read_pickle then names a version it does not take).
bool looks_like_pickle(std::string_view bytes);
// True when `bytes` looks like a pickle of protocol 0 or 1, which have no
// PROTO opcode: a container opcode first (MARK, EMPTY_DICT, EMPTY_LIST,
// EMPTY_TUPLE) and STOP last. This reader does not take them; the check only
// lets the error say so.
bool looks_like_old_pickle(std::string_view bytes);

// Reads one pickle from the start of `bytes` (what follows its STOP is
// ignored, as Python's pickle.load does).
PickleReadResult read_pickle(std::string bytes, const PickleLimits& limits = {});

}  // namespace spillway
