// A small strict JSON reader for tests: enough to parse what ringtrain writes (the --timeline
// trace) and to walk it, so a test checks the structure a viewer reads, not substrings. Throws
// std::runtime_error with the offset on anything that is not JSON (RFC 8259; no extensions).
#pragma once

#include <cctype>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace ringtrain::testing {

struct Json {
  using Array = std::vector<Json>;
  using Object = std::map<std::string, Json>;
  std::variant<std::nullptr_t, bool, double, std::string, std::shared_ptr<Array>,
               std::shared_ptr<Object>>
      value;

  bool is_object() const { return std::holds_alternative<std::shared_ptr<Object>>(value); }
  bool is_array() const { return std::holds_alternative<std::shared_ptr<Array>>(value); }
  bool is_number() const { return std::holds_alternative<double>(value); }
  bool is_string() const { return std::holds_alternative<std::string>(value); }
  const Object& object() const { return *std::get<std::shared_ptr<Object>>(value); }
  const Array& array() const { return *std::get<std::shared_ptr<Array>>(value); }
  double number() const { return std::get<double>(value); }
  const std::string& string() const { return std::get<std::string>(value); }
  bool has(const std::string& key) const { return is_object() && object().count(key) > 0; }
  const Json& operator[](const std::string& key) const { return object().at(key); }
};

class JsonReader {
 public:
  static Json parse(std::string_view text) {
    JsonReader reader(text);
    Json value = reader.read_value();
    reader.skip_space();
    if (reader.at_ != text.size()) reader.fail("trailing characters");
    return value;
  }

 private:
  explicit JsonReader(std::string_view text) : text_(text) {}

  [[noreturn]] void fail(const char* what) const {
    throw std::runtime_error(std::string("invalid JSON at offset ") + std::to_string(at_) + ": " +
                             what);
  }
  void skip_space() {
    while (at_ < text_.size() &&
           (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\r' || text_[at_] == '\t'))
      ++at_;
  }
  char peek() {
    skip_space();
    if (at_ >= text_.size()) fail("unexpected end");
    return text_[at_];
  }
  void expect(char c) {
    if (peek() != c) fail("unexpected character");
    ++at_;
  }
  void literal(std::string_view word) {
    if (text_.substr(at_, word.size()) != word) fail("bad literal");
    at_ += word.size();
  }

  Json read_value() {
    const char c = peek();
    if (c == '{') return read_object();
    if (c == '[') return read_array();
    if (c == '"') return Json{read_string()};
    if (c == 't') return literal("true"), Json{true};
    if (c == 'f') return literal("false"), Json{false};
    if (c == 'n') return literal("null"), Json{nullptr};
    return Json{read_number()};
  }
  Json read_object() {
    expect('{');
    auto object = std::make_shared<Json::Object>();
    if (peek() == '}') return ++at_, Json{object};
    for (;;) {
      if (peek() != '"') fail("expected a key");
      std::string key = read_string();
      expect(':');
      (*object)[key] = read_value();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      expect('}');
      return Json{object};
    }
  }
  Json read_array() {
    expect('[');
    auto array = std::make_shared<Json::Array>();
    if (peek() == ']') return ++at_, Json{array};
    for (;;) {
      array->push_back(read_value());
      if (peek() == ',') {
        ++at_;
        continue;
      }
      expect(']');
      return Json{array};
    }
  }
  std::string read_string() {
    expect('"');
    std::string out;
    while (at_ < text_.size() && text_[at_] != '"') {
      const char c = text_[at_++];
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= text_.size()) fail("unfinished escape");
      const char e = text_[at_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          if (at_ + 4 > text_.size()) fail("short \\u escape");
          const std::string hex(text_.substr(at_, 4));
          for (const char h : hex)
            if (!std::isxdigit(static_cast<unsigned char>(h))) fail("bad \\u escape");
          const long code = std::strtol(hex.c_str(), nullptr, 16);
          if (code >= 0x80) fail("non-ASCII \\u escapes are not needed here");
          out += static_cast<char>(code);
          at_ += 4;
          break;
        }
        default:
          fail("bad escape");
      }
    }
    expect('"');
    return out;
  }
  double read_number() {
    const size_t start = at_;
    if (at_ < text_.size() && text_[at_] == '-') ++at_;
    const auto digits = [this] {
      const size_t from = at_;
      while (at_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_]))) ++at_;
      return at_ - from;
    };
    const size_t whole = digits();
    if (whole == 0) fail("expected a value");
    if (whole > 1 && text_[at_ - whole] == '0') fail("leading zero");
    if (at_ < text_.size() && text_[at_] == '.') {
      ++at_;
      if (digits() == 0) fail("digits expected after '.'");
    }
    if (at_ < text_.size() && (text_[at_] == 'e' || text_[at_] == 'E')) {
      ++at_;
      if (at_ < text_.size() && (text_[at_] == '+' || text_[at_] == '-')) ++at_;
      if (digits() == 0) fail("digits expected in the exponent");
    }
    return std::strtod(std::string(text_.substr(start, at_ - start)).c_str(), nullptr);
  }

  std::string_view text_;
  size_t at_ = 0;
};

}  // namespace ringtrain::testing
