// FlagSet: one definition per setting gives both a command-line flag (CLI11) and a config-file key
// of the same name, so farmemd's core and every service declare their settings once, in their own
// folder. Precedence: a flag given on the command line wins over the config file, which wins over
// the default. Used on the thread that parses the command line only.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "farmem/status.h"

// CLI11 is only named here: its header costs ~6 s of compile time per file, and every service
// includes this one (flags.cc and the mains that parse include it).
namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace farmem {

class FlagSet {
 public:
  explicit FlagSet(CLI::App& app) : app_(app) {}
  FlagSet(const FlagSet&) = delete;
  FlagSet& operator=(const FlagSet&) = delete;

  // --KEY VALUE into *target (std::string, bool, an integer type or double); *target's current
  // value is the default shown in --help. Instantiated in flags.cc for each of those types.
  template <typename T>
  void add(std::string key, T* target, std::string help);
  // --KEY MIB into *bytes (as bytes); at most 64 TiB.
  void add_mib(std::string key, uint64_t* bytes, std::string help);
  // --KEY NAME into *target, NAME one of `choices`.
  template <typename E>
  void add_choice(std::string key, E* target, std::vector<std::pair<std::string, E>> choices,
                  std::string help);
  // --KEY A,B,C into *target.
  void add_list(std::string key, std::vector<std::string>* target, std::string help);

  // True when --KEY was on the command line.
  bool given(std::string_view key) const;

  // Applies a JSON config object: keys use the flag names ('_' may stand for '-'), and a nested
  // object is a key prefix ({"objects": {"block-size": 4096}} is "objects-block-size"). Keys also
  // given as flags are skipped; unknown keys and wrong types are InvalidArgument errors.
  Status apply_config(const nlohmann::json& config);

  // Runs the conversions that need the parsed text (MiB -> bytes, names -> enums); call once
  // after parsing and apply_config. InvalidArgument names the flag.
  Status finish();

 private:
  struct Entry {
    std::string key;
    CLI::Option* option = nullptr;
    std::function<Status(const nlohmann::json&)> set_from_json;
  };
  Status ApplyKey(std::string key, const nlohmann::json& value);
  template <typename T>
  static Status FromJson(const std::string& key, const nlohmann::json& v, T* target);

  CLI::App& app_;
  std::vector<Entry> entries_;
  std::vector<std::function<Status()>> finishers_;
  std::deque<std::string> text_storage_;  // stable addresses for options parsed as text
  std::deque<uint64_t> number_storage_;
};

template <typename T>
Status FlagSet::FromJson(const std::string& key, const nlohmann::json& v, T* target) {
  if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) return Status::InvalidArgument("config key '" + key + "' must be a string");
    *target = v.get<std::string>();
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) {
      return Status::InvalidArgument("config key '" + key + "' must be true or false");
    }
    *target = v.get<bool>();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) return Status::InvalidArgument("config key '" + key + "' must be a number");
    *target = v.get<T>();
  } else {
    static_assert(std::is_integral_v<T>, "FlagSet::add takes strings, bools, integers, doubles");
    if (!v.is_number_integer()) {
      return Status::InvalidArgument("config key '" + key + "' must be an integer");
    }
    if constexpr (std::is_unsigned_v<T>) {
      if (!v.is_number_unsigned() && v.get<int64_t>() < 0) {
        return Status::InvalidArgument("config key '" + key + "' must not be negative");
      }
    }
    // No silent truncation: the value must fit the setting's type.
    const bool fits =
        v.is_number_unsigned()
            ? v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
            : v.get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                  (v.get<int64_t>() < 0 ||
                   static_cast<uint64_t>(v.get<int64_t>()) <=
                       static_cast<uint64_t>(std::numeric_limits<T>::max()));
    if (!fits) return Status::InvalidArgument("config key '" + key + "' is out of range");
    *target = v.get<T>();
  }
  return Status::OK();
}

template <typename E>
void FlagSet::add_choice(std::string key, E* target, std::vector<std::pair<std::string, E>> choices,
                         std::string help) {
  std::string names;
  std::string current;
  for (const auto& [name, value] : choices) {
    names += (names.empty() ? "" : " | ") + name;
    if (value == *target) current = name;
  }
  std::string& text = text_storage_.emplace_back(current);
  add(key, &text, help + ": " + names);
  finishers_.push_back([key, target, choices = std::move(choices), names, &text]() -> Status {
    for (const auto& [name, value] : choices) {
      if (name == text) {
        *target = value;
        return Status::OK();
      }
    }
    return Status::InvalidArgument("--" + key + " must be one of " + names + ", got '" + text +
                                   "'");
  });
}

}  // namespace farmem
