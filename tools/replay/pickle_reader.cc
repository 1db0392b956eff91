// The pickle stack machine, for plain data only (Note [A pickle reader that
// runs no code]). Opcode values and meanings: CPython's Lib/pickletools.py.
#include "tools/replay/pickle_reader.h"

#include <cstring>
#include <limits>
#include <optional>
#include <unordered_map>
#include <utility>

namespace spillway {

namespace {

// The opcodes, by value. Protocol 0/1 text forms that protocol 2+ picklers
// never write (INT, LONG, FLOAT, STRING, UNICODE, PUT, GET) are not
// interpreted; they are reported as unsupported.
enum Op : std::uint8_t {
  kMark = '(',
  kStop = '.',
  kPop = '0',
  kPopMark = '1',
  kDup = '2',
  kFloat = 'F',
  kInt = 'I',
  kBinInt = 'J',
  kBinInt1 = 'K',
  kLong = 'L',
  kBinInt2 = 'M',
  kNone = 'N',
  kPersId = 'P',
  kBinPersId = 'Q',
  kReduce = 'R',
  kString = 'S',
  kBinString = 'T',
  kShortBinString = 'U',
  kUnicode = 'V',
  kBinUnicode = 'X',
  kAppend = 'a',
  kBuild = 'b',
  kGlobal = 'c',
  kDict = 'd',
  kEmptyDict = '}',
  kAppends = 'e',
  kGet = 'g',
  kBinGet = 'h',
  kInst = 'i',
  kLongBinGet = 'j',
  kList = 'l',
  kEmptyList = ']',
  kObj = 'o',
  kPut = 'p',
  kBinPut = 'q',
  kLongBinPut = 'r',
  kSetItem = 's',
  kTuple = 't',
  kEmptyTuple = ')',
  kSetItems = 'u',
  kBinFloat = 'G',
  kBinBytes = 'B',
  kShortBinBytes = 'C',
  kProto = 0x80,
  kNewObj = 0x81,
  kExt1 = 0x82,
  kExt2 = 0x83,
  kExt4 = 0x84,
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kLong1 = 0x8a,
  kLong4 = 0x8b,
  kShortBinUnicode = 0x8c,
  kBinUnicode8 = 0x8d,
  kBinBytes8 = 0x8e,
  kEmptySet = 0x8f,
  kAddItems = 0x90,
  kFrozenSet = 0x91,
  kNewObjEx = 0x92,
  kStackGlobal = 0x93,
  kMemoize = 0x94,
  kFrame = 0x95,
  kByteArray8 = 0x96,
  kNextBuffer = 0x97,
  kReadonlyBuffer = 0x98,
};

const char* op_name(std::uint8_t op) {
  switch (op) {
    case kMark:
      return "MARK";
    case kStop:
      return "STOP";
    case kPop:
      return "POP";
    case kPopMark:
      return "POP_MARK";
    case kDup:
      return "DUP";
    case kFloat:
      return "FLOAT";
    case kInt:
      return "INT";
    case kBinInt:
      return "BININT";
    case kBinInt1:
      return "BININT1";
    case kLong:
      return "LONG";
    case kBinInt2:
      return "BININT2";
    case kNone:
      return "NONE";
    case kPersId:
      return "PERSID";
    case kBinPersId:
      return "BINPERSID";
    case kReduce:
      return "REDUCE";
    case kString:
      return "STRING";
    case kBinString:
      return "BINSTRING";
    case kShortBinString:
      return "SHORT_BINSTRING";
    case kUnicode:
      return "UNICODE";
    case kBinUnicode:
      return "BINUNICODE";
    case kAppend:
      return "APPEND";
    case kBuild:
      return "BUILD";
    case kGlobal:
      return "GLOBAL";
    case kDict:
      return "DICT";
    case kEmptyDict:
      return "EMPTY_DICT";
    case kAppends:
      return "APPENDS";
    case kGet:
      return "GET";
    case kBinGet:
      return "BINGET";
    case kInst:
      return "INST";
    case kLongBinGet:
      return "LONG_BINGET";
    case kList:
      return "LIST";
    case kEmptyList:
      return "EMPTY_LIST";
    case kObj:
      return "OBJ";
    case kPut:
      return "PUT";
    case kBinPut:
      return "BINPUT";
    case kLongBinPut:
      return "LONG_BINPUT";
    case kSetItem:
      return "SETITEM";
    case kTuple:
      return "TUPLE";
    case kEmptyTuple:
      return "EMPTY_TUPLE";
    case kSetItems:
      return "SETITEMS";
    case kBinFloat:
      return "BINFLOAT";
    case kBinBytes:
      return "BINBYTES";
    case kShortBinBytes:
      return "SHORT_BINBYTES";
    case kProto:
      return "PROTO";
    case kNewObj:
      return "NEWOBJ";
    case kExt1:
      return "EXT1";
    case kExt2:
      return "EXT2";
    case kExt4:
      return "EXT4";
    case kTuple1:
      return "TUPLE1";
    case kTuple2:
      return "TUPLE2";
    case kTuple3:
      return "TUPLE3";
    case kNewTrue:
      return "NEWTRUE";
    case kNewFalse:
      return "NEWFALSE";
    case kLong1:
      return "LONG1";
    case kLong4:
      return "LONG4";
    case kShortBinUnicode:
      return "SHORT_BINUNICODE";
    case kBinUnicode8:
      return "BINUNICODE8";
    case kBinBytes8:
      return "BINBYTES8";
    case kEmptySet:
      return "EMPTY_SET";
    case kAddItems:
      return "ADDITEMS";
    case kFrozenSet:
      return "FROZENSET";
    case kNewObjEx:
      return "NEWOBJ_EX";
    case kStackGlobal:
      return "STACK_GLOBAL";
    case kMemoize:
      return "MEMOIZE";
    case kFrame:
      return "FRAME";
    case kByteArray8:
      return "BYTEARRAY8";
    case kNextBuffer:
      return "NEXT_BUFFER";
    case kReadonlyBuffer:
      return "READONLY_BUFFER";
    default:
      return nullptr;
  }
}

std::string hex_byte(std::uint8_t byte) {
  static constexpr char kDigits[] = "0123456789abcdef";
  return std::string("0x") + kDigits[byte >> 4] + kDigits[byte & 15];
}

// A printable, shortened copy of a name from the file, for messages.
std::string printable(std::string_view text) {
  std::string out;
  for (const char c : text.substr(0, 80)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (text.size() > 80) out += "...";
  return out;
}

}  // namespace

class PickleParser {
 public:
  PickleParser(std::string bytes, const PickleLimits& limits) : limits_(limits) {
    document_.bytes_ = std::move(bytes);
    data_ = document_.bytes_;
  }

  PickleReadResult run() {
    PickleReadResult result;
    if (!parse()) {
      result.error = std::move(error_);
      return result;
    }
    result.document = std::move(document_);
    return result;
  }

 private:
  bool parse() {
    if (data_.empty()) return fail_at(0, "empty file, not a pickle");
    if (static_cast<std::uint8_t>(data_[0]) != kProto)
      return fail_at(0, "not a pickle of protocol 2 or later (it does not start with PROTO, 0x80)");
    while (true) {
      if (at_ >= data_.size())
        return fail_at(at_, "file ends without STOP after " + std::to_string(data_.size()) +
                                " bytes (truncated?)");
      op_at_ = at_;
      op_ = static_cast<std::uint8_t>(data_[at_++]);
      bool done = false;
      if (!step(&done)) return false;
      if (done) return true;
    }
  }

  // Executes the opcode op_ (its argument starts at at_).
  bool step(bool* done) {
    switch (op_) {
      case kProto: {
        std::uint64_t version;
        if (!read_uint(1, &version)) return false;
        if (version < 2 || version > 5)
          return fail("protocol " + std::to_string(version) + " (this reader takes 2 to 5)");
        return true;
      }
      case kFrame: {
        // The frame's length only groups opcodes for buffered reading; every
        // read below is checked against the end of the file anyway.
        std::uint64_t length;
        return read_uint(8, &length);
      }
      case kStop: {
        if (stack_.empty()) return fail("STOP with an empty stack");
        document_.root_ = stack_.back();
        *done = true;
        return true;
      }
      case kMark:
        if (marks_.size() >= limits_.max_mark_depth)
          return fail("MARKs nested deeper than " + std::to_string(limits_.max_mark_depth));
        marks_.push_back(stack_.size());
        return true;
      case kPop:  // the top item, or the last MARK when nothing is above it (as CPython)
        if (!stack_.empty() && (marks_.empty() || marks_.back() < stack_.size())) {
          stack_.pop_back();
          return true;
        }
        if (marks_.empty()) return fail("POP with an empty stack");
        marks_.pop_back();
        return true;
      case kPopMark: {
        std::size_t mark;
        if (!pop_mark(&mark)) return false;
        stack_.resize(mark);
        return true;
      }
      case kDup:
        if (stack_.empty()) return fail("DUP with an empty stack");
        return push_ref(stack_.back());

      case kNone:
        return push(PickleValue{PickleValue::Kind::none, 0, 0});
      case kNewTrue:
        return push(PickleValue{PickleValue::Kind::boolean, 0, 1});
      case kNewFalse:
        return push(PickleValue{PickleValue::Kind::boolean, 0, 0});
      case kBinInt: {
        std::uint64_t raw;
        if (!read_uint(4, &raw)) return false;
        return push_int(static_cast<std::int32_t>(static_cast<std::uint32_t>(raw)));
      }
      case kBinInt1:
      case kBinInt2: {
        std::uint64_t raw;
        if (!read_uint(op_ == kBinInt1 ? 1 : 2, &raw)) return false;
        return push_int(static_cast<std::int64_t>(raw));
      }
      case kLong1:
      case kLong4: {
        std::uint64_t length;
        if (!read_uint(op_ == kLong1 ? 1 : 4, &length)) return false;
        return read_long(length);
      }
      case kBinFloat: {
        std::string_view raw;
        if (!read_bytes(8, &raw)) return false;
        std::uint64_t bits = 0;
        for (const char c : raw) bits = (bits << 8) | static_cast<std::uint8_t>(c);  // big-endian
        return push(PickleValue{PickleValue::Kind::floating, 0, static_cast<std::int64_t>(bits)});
      }

      case kShortBinUnicode:
        return read_text(1, PickleValue::Kind::string);
      case kBinUnicode:
        return read_text(4, PickleValue::Kind::string);
      case kBinUnicode8:
        return read_text(8, PickleValue::Kind::string);
      // Python 2 str: text to Python 3's default unpickler (encoding ASCII).
      case kShortBinString:
        return read_text(1, PickleValue::Kind::string);
      case kBinString:
        return read_text(4, PickleValue::Kind::string);
      case kShortBinBytes:
        return read_text(1, PickleValue::Kind::bytes);
      case kBinBytes:
        return read_text(4, PickleValue::Kind::bytes);
      case kBinBytes8:
      case kByteArray8:
        return read_text(8, PickleValue::Kind::bytes);

      case kEmptyList:
        return push_container(PickleValue::Kind::list, {});
      case kEmptyDict:
        return push_container(PickleValue::Kind::dict, {});
      case kEmptySet:
        return push_container(PickleValue::Kind::set, {});
      case kEmptyTuple:
        return push_container(PickleValue::Kind::tuple, {});
      case kTuple1:
      case kTuple2:
      case kTuple3: {
        const std::size_t count = op_ - kTuple1 + 1;
        if (stack_.size() < count + (marks_.empty() ? 0 : marks_.back()))
          return fail("needs " + std::to_string(count) + " items above the last MARK");
        std::vector<PickleRef> items(stack_.end() - count, stack_.end());
        stack_.resize(stack_.size() - count);
        return push_container(PickleValue::Kind::tuple, std::move(items));
      }
      case kTuple:
      case kList:
      case kFrozenSet:
      case kDict: {
        std::size_t mark;
        if (!pop_mark(&mark)) return false;
        std::vector<PickleRef> items(stack_.begin() + mark, stack_.end());
        stack_.resize(mark);
        if (op_ == kDict && items.size() % 2 != 0)
          return fail("an odd number of items (keys and values) above the MARK");
        const auto kind = op_ == kTuple  ? PickleValue::Kind::tuple
                          : op_ == kList ? PickleValue::Kind::list
                          : op_ == kDict ? PickleValue::Kind::dict
                                         : PickleValue::Kind::set;
        return push_container(kind, std::move(items));
      }
      case kAppend:
      case kSetItem: {
        const std::size_t count = op_ == kAppend ? 1 : 2;
        const std::size_t floor = marks_.empty() ? 0 : marks_.back();
        if (stack_.size() < floor + count + 1)
          return fail("needs a container and " + std::to_string(count) +
                      " items above the last MARK");
        const std::size_t first = stack_.size() - count;
        return extend(stack_[first - 1], first,
                      op_ == kAppend ? PickleValue::Kind::list : PickleValue::Kind::dict);
      }
      case kAppends:
      case kSetItems:
      case kAddItems: {
        std::size_t mark;
        if (!pop_mark(&mark)) return false;
        if (mark == 0 || (!marks_.empty() && marks_.back() >= mark))
          return fail("no container below the MARK");
        if (op_ == kSetItems && (stack_.size() - mark) % 2 != 0)
          return fail("an odd number of items (keys and values) above the MARK");
        const auto kind = op_ == kAppends    ? PickleValue::Kind::list
                          : op_ == kSetItems ? PickleValue::Kind::dict
                                             : PickleValue::Kind::set;
        return extend(stack_[mark - 1], mark, kind);
      }

      case kBinPut:
      case kLongBinPut: {
        std::uint64_t index;
        if (!read_uint(op_ == kBinPut ? 1 : 4, &index)) return false;
        return memo_put(index);
      }
      case kMemoize:
        return memo_put(memo_.size());
      case kBinGet:
      case kLongBinGet: {
        std::uint64_t index;
        if (!read_uint(op_ == kBinGet ? 1 : 4, &index)) return false;
        const auto it = memo_.find(index);
        if (it == memo_.end())
          return fail("memo entry " + std::to_string(index) + " was never stored");
        return push_ref(it->second);
      }

      case kGlobal: {
        // Two text lines, module and name: read them only to say which.
        const std::size_t module_end = data_.find('\n', at_);
        const std::size_t name_end =
            module_end == std::string_view::npos ? module_end : data_.find('\n', module_end + 1);
        if (name_end == std::string_view::npos) return refuse_code("");
        return refuse_code(printable(data_.substr(at_, module_end - at_)) + "." +
                           printable(data_.substr(module_end + 1, name_end - module_end - 1)));
      }
      case kStackGlobal: {
        if (stack_.size() >= 2 &&
            document_.kind(stack_[stack_.size() - 2]) == PickleValue::Kind::string &&
            document_.kind(stack_.back()) == PickleValue::Kind::string)
          return refuse_code(printable(document_.text(stack_[stack_.size() - 2])) + "." +
                             printable(document_.text(stack_.back())));
        return refuse_code("");
      }
      case kReduce:
      case kBuild:
      case kInst:
      case kObj:
      case kNewObj:
      case kNewObjEx:
      case kExt1:
      case kExt2:
      case kExt4:
      case kPersId:
      case kBinPersId:
        return refuse_code("");
      case kNextBuffer:
      case kReadonlyBuffer:
        return fail(std::string(op_name(op_)) +
                    " refers to an out-of-band buffer, which a file does not carry");

      case kInt:
      case kLong:
      case kFloat:
      case kString:
      case kUnicode:
      case kPut:
      case kGet:
        return fail(std::string(op_name(op_)) +
                    " is a protocol 0 text opcode, which this reader does not take");
      default:
        return fail("unknown opcode " + hex_byte(op_));
    }
  }

  bool fail_at(std::size_t offset, const std::string& what) {
    error_ = "byte offset " + std::to_string(offset) + ": " + what;
    return false;
  }
  // An error about the current opcode.
  bool fail(const std::string& what) {
    const char* name = op_name(op_);
    return fail_at(op_at_, (name ? std::string(name) + ": " : std::string()) + what);
  }
  bool refuse_code(const std::string& target) {
    return fail_at(op_at_,
                   std::string(op_name(op_)) + " (opcode " + hex_byte(op_) + ")" +
                       (target.empty() ? "" : " names " + target) +
                       ": the pickle refers to a class or function; this reader reads plain data "
                       "only (dicts, lists, tuples, str, bytes, int, float, bool, None) and "
                       "never runs pickle code");
  }
  bool truncated(std::uint64_t needed) {
    return fail("file ends inside the opcode (needs " + std::to_string(needed) + " bytes after " +
                "byte offset " + std::to_string(at_) + ", the file has " +
                std::to_string(data_.size()) + "; truncated?)");
  }

  bool read_bytes(std::uint64_t count, std::string_view* out) {
    if (count > data_.size() - at_) return truncated(count);
    *out = data_.substr(at_, count);
    at_ += count;
    return true;
  }
  bool read_uint(std::size_t width, std::uint64_t* out) {
    std::string_view raw;
    if (!read_bytes(width, &raw)) return false;
    std::uint64_t value = 0;
    for (std::size_t i = width; i-- > 0;) value = (value << 8) | static_cast<std::uint8_t>(raw[i]);
    *out = value;
    return true;
  }
  // LONG1/LONG4: little-endian two's complement of `length` bytes.
  bool read_long(std::uint64_t length) {
    std::string_view raw;
    if (!read_bytes(length, &raw)) return false;
    if (length > 8) {
      // Wider encodings are fine when they only sign-extend a 64-bit value.
      const char fill = static_cast<char>(raw[7] & 0x80 ? 0xff : 0x00);
      for (std::size_t i = 8; i < length; ++i)
        if (raw[i] != fill) return fail("an integer wider than 64 bits");
      raw = raw.substr(0, 8);
    }
    std::uint64_t value = 0;
    for (std::size_t i = raw.size(); i-- > 0;)
      value = (value << 8) | static_cast<std::uint8_t>(raw[i]);
    if (!raw.empty() && raw.size() < 8 && (static_cast<std::uint8_t>(raw.back()) & 0x80))
      value |= ~std::uint64_t{0} << (8 * raw.size());  // sign-extend
    return push_int(static_cast<std::int64_t>(value));
  }
  bool read_text(std::size_t length_width, PickleValue::Kind kind) {
    std::uint64_t length;
    if (!read_uint(length_width, &length)) return false;
    if (length > std::numeric_limits<std::uint32_t>::max())
      return fail("a string of " + std::to_string(length) + " bytes (at most 4 GiB)");
    const std::size_t offset = at_;
    std::string_view ignored;
    if (!read_bytes(length, &ignored)) return false;
    return push(
        PickleValue{kind, static_cast<std::uint32_t>(length), static_cast<std::int64_t>(offset)});
  }

  bool push_int(std::int64_t value) {
    return push(PickleValue{PickleValue::Kind::integer, 0, value});
  }
  bool push(const PickleValue& value) {
    if (document_.values_.size() >= limits_.max_values)
      return fail("more than " + std::to_string(limits_.max_values) + " values");
    document_.values_.push_back(value);
    return push_ref(static_cast<PickleRef>(document_.values_.size() - 1));
  }
  bool push_ref(PickleRef ref) {
    if (stack_.size() >= limits_.max_stack)
      return fail("more than " + std::to_string(limits_.max_stack) + " items on the stack");
    stack_.push_back(ref);
    return true;
  }
  bool push_container(PickleValue::Kind kind, std::vector<PickleRef> items) {
    document_.containers_.push_back(std::move(items));
    return push(PickleValue{kind, 0, static_cast<std::int64_t>(document_.containers_.size() - 1)});
  }
  bool pop_mark(std::size_t* mark) {
    if (marks_.empty()) return fail("no MARK to pop to");
    *mark = marks_.back();
    marks_.pop_back();
    return true;
  }
  // Moves stack_[first, end) into `target`, which must be of `kind`.
  bool extend(PickleRef target, std::size_t first, PickleValue::Kind kind) {
    const PickleValue& value = document_.values_[target];
    if (value.kind != kind)
      return fail("adds items to " + std::string(PickleDocument::describe(value.kind)) +
                  ", not to " + std::string(PickleDocument::describe(kind)));
    auto& items = document_.containers_[static_cast<std::size_t>(value.payload)];
    items.insert(items.end(), stack_.begin() + first, stack_.end());
    stack_.resize(first);
    return true;
  }
  bool memo_put(std::uint64_t index) {
    if (stack_.empty()) return fail("stores an empty stack in the memo");
    memo_[index] = stack_.back();
    return true;
  }

  PickleLimits limits_;
  PickleDocument document_;
  std::string_view data_;
  std::size_t at_ = 0;     // next byte to read
  std::size_t op_at_ = 0;  // offset of the opcode being executed
  std::uint8_t op_ = 0;
  std::vector<PickleRef> stack_;
  std::vector<std::size_t> marks_;  // stack sizes at each open MARK
  std::unordered_map<std::uint64_t, PickleRef> memo_;
  std::string error_;
};

std::string_view PickleDocument::text(PickleRef ref) const {
  const PickleValue& v = values_[ref];
  if (v.kind != PickleValue::Kind::string && v.kind != PickleValue::Kind::bytes) return {};
  return std::string_view(bytes_).substr(static_cast<std::size_t>(v.payload), v.length);
}

std::int64_t PickleDocument::integer(PickleRef ref) const {
  const PickleValue& v = values_[ref];
  return v.kind == PickleValue::Kind::integer || v.kind == PickleValue::Kind::boolean ? v.payload
                                                                                      : 0;
}

double PickleDocument::number(PickleRef ref) const {
  const PickleValue& v = values_[ref];
  if (v.kind == PickleValue::Kind::integer) return static_cast<double>(v.payload);
  if (v.kind != PickleValue::Kind::floating) return 0;
  double out;
  std::memcpy(&out, &v.payload, sizeof out);
  return out;
}

const std::vector<PickleRef>& PickleDocument::items(PickleRef ref) const {
  static const std::vector<PickleRef> kEmpty;
  const PickleValue& v = values_[ref];
  switch (v.kind) {
    case PickleValue::Kind::list:
    case PickleValue::Kind::tuple:
    case PickleValue::Kind::dict:
    case PickleValue::Kind::set:
      return containers_[static_cast<std::size_t>(v.payload)];
    default:
      return kEmpty;
  }
}

// Note [Large dicts are indexed]
// A snapshot's history entries are small dicts, looked up a few keys each,
// so a scan is the fastest find. But a pickle may hold one dict of many
// keys and refer to it from every entry (the memo makes that cheap), and a
// scan per lookup then makes reading it quadratic: a 389 KB file took 14 s.
// A dict of more than kIndexedDictKeys keys gets a hash index of its string
// keys at its first lookup (the last position of a repeated key, as the
// scan finds). The document is read by one thread, hence the mutable cache.
const PickleRef* PickleDocument::find(PickleRef dict, std::string_view key) const {
  if (kind(dict) != PickleValue::Kind::dict) return nullptr;
  const std::vector<PickleRef>& entries = items(dict);
  if (entries.size() / 2 > kIndexedDictKeys) {
    auto [index, built] = dict_index_.try_emplace(dict);
    if (built)
      for (std::size_t i = 0; i + 1 < entries.size(); i += 2)
        if (kind(entries[i]) == PickleValue::Kind::string) index->second[text(entries[i])] = i;
    const auto found = index->second.find(key);
    return found == index->second.end() ? nullptr : &entries[found->second + 1];
  }
  for (std::size_t i = entries.size(); i >= 2; i -= 2)
    if (kind(entries[i - 2]) == PickleValue::Kind::string && text(entries[i - 2]) == key)
      return &entries[i - 1];
  return nullptr;
}

std::string_view PickleDocument::describe(PickleValue::Kind kind) {
  switch (kind) {
    case PickleValue::Kind::none:
      return "None";
    case PickleValue::Kind::boolean:
      return "a bool";
    case PickleValue::Kind::integer:
      return "an integer";
    case PickleValue::Kind::floating:
      return "a float";
    case PickleValue::Kind::string:
      return "a string";
    case PickleValue::Kind::bytes:
      return "bytes";
    case PickleValue::Kind::list:
      return "a list";
    case PickleValue::Kind::tuple:
      return "a tuple";
    case PickleValue::Kind::dict:
      return "a dict";
    case PickleValue::Kind::set:
      return "a set";
  }
  return "a value";
}

bool looks_like_pickle(std::string_view bytes) {
  // Any PROTO: a version this reader does not take is its error, not CSV's.
  return !bytes.empty() && static_cast<std::uint8_t>(bytes[0]) == kProto;
}

bool looks_like_old_pickle(std::string_view bytes) {
  if (bytes.size() < 2 || bytes.back() != kStop) return false;
  const auto first = static_cast<std::uint8_t>(bytes.front());
  return first == kMark || first == kEmptyDict || first == kEmptyList || first == kEmptyTuple;
}

PickleReadResult read_pickle(std::string bytes, const PickleLimits& limits) {
  return PickleParser(std::move(bytes), limits).run();
}

}  // namespace spillway
