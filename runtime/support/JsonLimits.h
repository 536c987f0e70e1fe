//===- JsonLimits.h - Bounded, duplicate-free JSON parsing ----------------===//
//
// Every JSON document dlopt reads from outside (executables, safetensors
// headers, checkpoint metadata, cluster files, plans, calibration files)
// goes through parseJsonBounded. It first runs nlohmann's iterative SAX
// parser with a checker that refuses
//   - nesting deeper than a limit: nlohmann's DOM copies and compares values
//     recursively, so ~90k levels overflow the stack long after parsing;
//   - duplicate keys in one object: nlohmann keeps the last silently, so a
//     file could say two things and dlopt would believe one of them;
// and only then builds the DOM. Errors name the JSON pointer where they
// occur. Header-only so the runtime and the planner share it without a new
// library (both already depend on nlohmann).
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/support/Status.h"

#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace dlopt::rt {

/// Deepest nesting any dlopt document needs is about 8 (plan files); 64 is
/// generous and keeps every recursive DOM walk a few KiB of stack.
inline constexpr int kMaxJsonDepth = 64;

namespace json_detail {

/// Escapes one reference token of a JSON pointer (RFC 6901), shortened.
inline std::string pointerToken(const std::string &key) {
  std::string out;
  for (char c : key.substr(0, 64)) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else if (static_cast<unsigned char>(c) < 0x20)
      out += '?';
    else
      out += c;
  }
  if (key.size() > 64)
    out += "...";
  return out;
}

/// SAX handler: tracks the open containers and stops at the first problem.
class StructureChecker {
public:
  using Json = nlohmann::json;
  explicit StructureChecker(int maxDepth) : maxDepth_(maxDepth) {}

  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(Json::number_integer_t) { return value(); }
  bool number_unsigned(Json::number_unsigned_t) { return value(); }
  bool number_float(Json::number_float_t, const Json::string_t &) {
    return value();
  }
  bool string(Json::string_t &) { return value(); }
  bool binary(Json::binary_t &) { return value(); }
  bool start_object(std::size_t) { return open(true); }
  bool end_object() { return close(); }
  bool start_array(std::size_t) { return open(false); }
  bool end_array() { return close(); }
  bool key(Json::string_t &k) {
    Frame &f = frames_.back();
    if (!f.keys.insert(k).second) {
      error_ = "duplicate key \"" + pointerToken(k) + "\" in the object at " +
               pointer(frames_.size() - 1) +
               " (each key may appear once)";
      return false;
    }
    f.key = k;
    return true;
  }
  bool parse_error(std::size_t, const std::string &,
                   const nlohmann::detail::exception &e) {
    error_ = e.what();
    syntax_ = true;
    return false;
  }

  const std::string &error() const { return error_; }
  bool syntaxError() const { return syntax_; }

private:
  struct Frame {
    bool object = false;
    std::size_t index = 0; // arrays: the next element's index
    std::string key;       // objects: the current key
    std::set<std::string> keys;
  };

  bool value() {
    if (!frames_.empty() && !frames_.back().object)
      ++frames_.back().index;
    return true;
  }
  bool open(bool object) {
    if (static_cast<int>(frames_.size()) >= maxDepth_) {
      error_ = "nested deeper than " + std::to_string(maxDepth_) +
               " levels at " + pointer(frames_.size()) +
               " (no dlopt file needs more)";
      return false;
    }
    frames_.push_back(Frame{object, 0, {}, {}});
    return true;
  }
  bool close() {
    frames_.pop_back();
    return value();
  }
  /// JSON pointer of the value being read inside the first `n` frames;
  /// shortened in the middle when deep.
  std::string pointer(std::size_t n) const {
    std::string out;
    for (std::size_t i = 0; i < n; ++i) {
      if (n > 12 && i == 6) {
        out += "/...";
        i = n - 6;
      }
      const Frame &f = frames_[i];
      // Appended piecewise: "/" + std::string trips GCC 12's -Wrestrict
      // false positive (PR 105329) where this inlines.
      out += '/';
      out += f.object ? pointerToken(f.key) : std::to_string(f.index);
    }
    return out.empty() ? "the top level" : out;
  }

  int maxDepth_;
  std::vector<Frame> frames_;
  std::string error_;
  bool syntax_ = false;
};

} // namespace json_detail

/// Parses [begin, end) as JSON into `JsonT` (nlohmann::json or
/// ordered_json) after checking its depth and keys. The error message has
/// no source prefix; callers add the file name.
template <typename JsonT>
Expected<JsonT> parseJsonBounded(const char *begin, const char *end,
                                 bool ignoreComments = false,
                                 int maxDepth = kMaxJsonDepth) {
  json_detail::StructureChecker checker(maxDepth);
  bool ok = nlohmann::json::sax_parse(begin, end, &checker,
                                      nlohmann::json::input_format_t::json,
                                      /*strict=*/true, ignoreComments);
  if (!ok)
    return Status::error(checker.syntaxError()
                             ? "invalid JSON: " + checker.error()
                             : checker.error());
  try {
    return JsonT::parse(begin, end, nullptr, /*allow_exceptions=*/true,
                        ignoreComments);
  } catch (const nlohmann::json::exception &e) {
    return Status::error(std::string("invalid JSON: ") + e.what());
  }
}

template <typename JsonT>
Expected<JsonT> parseJsonBounded(std::string_view text,
                                 bool ignoreComments = false,
                                 int maxDepth = kMaxJsonDepth) {
  return parseJsonBounded<JsonT>(text.data(), text.data() + text.size(),
                                 ignoreComments, maxDepth);
}

} // namespace dlopt::rt
