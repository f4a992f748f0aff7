// FlagSet: config-file application (nested sections, '_' as '-') and the MiB / list conversions.
#include "service/flags.h"

#include <CLI/CLI.hpp>

namespace farmem {

void FlagSet::add_mib(std::string key, uint64_t* bytes, std::string help) {
  uint64_t& mib = number_storage_.emplace_back(*bytes >> 20);
  add(key, &mib, std::move(help));
  finishers_.push_back([key, bytes, &mib]() -> Status {
    if (mib > (64ull << 20)) return Status::InvalidArgument("--" + key + " must be at most 64 TiB");
    *bytes = mib << 20;
    return Status::OK();
  });
}

void FlagSet::add_list(std::string key, std::vector<std::string>* target, std::string help) {
  std::string joined;
  for (const std::string& s : *target) joined += (joined.empty() ? "" : ",") + s;
  std::string& text = text_storage_.emplace_back(joined);
  add(key, &text, std::move(help));
  finishers_.push_back([target, &text]() -> Status {
    target->clear();
    size_t start = 0;
    while (start <= text.size()) {
      size_t comma = text.find(',', start);
      if (comma == std::string::npos) comma = text.size();
      std::string item = text.substr(start, comma - start);
      if (!item.empty()) target->push_back(std::move(item));
      start = comma + 1;
    }
    return Status::OK();
  });
}

bool FlagSet::given(std::string_view key) const {
  for (const Entry& e : entries_) {
    if (e.key == key) return e.option->count() > 0;
  }
  return false;
}

Status FlagSet::ApplyKey(std::string key, const nlohmann::json& value) {
  for (char& c : key) {
    if (c == '_') c = '-';
  }
  for (const Entry& e : entries_) {
    if (e.key != key) continue;
    if (e.option->count() > 0) return Status::OK();  // the command line wins
    // A list may also be written as a JSON array of names.
    if (value.is_array()) {
      std::string joined;
      for (const auto& item : value) {
        if (!item.is_string()) {
          return Status::InvalidArgument("config key '" + key + "' must list strings");
        }
        joined += (joined.empty() ? "" : ",") + item.get<std::string>();
      }
      return e.set_from_json(nlohmann::json(joined));
    }
    return e.set_from_json(value);
  }
  if (value.is_object()) {
    for (const auto& [k, sub] : value.items()) FARMEM_RETURN_IF_ERROR(ApplyKey(key + "-" + k, sub));
    return Status::OK();
  }
  return Status::InvalidArgument("unknown config key '" + key + "'");
}

Status FlagSet::apply_config(const nlohmann::json& config) {
  if (!config.is_object()) return Status::InvalidArgument("the config is not a JSON object");
  for (const auto& [k, v] : config.items()) FARMEM_RETURN_IF_ERROR(ApplyKey(k, v));
  return Status::OK();
}

Status FlagSet::finish() {
  for (const auto& f : finishers_) FARMEM_RETURN_IF_ERROR(f());
  return Status::OK();
}

template <typename T>
void FlagSet::add(std::string key, T* target, std::string help) {
  CLI::Option* opt = app_.add_option("--" + key, *target, std::move(help))->capture_default_str();
  entries_.push_back(
      {key, opt, [key, target](const nlohmann::json& v) { return FromJson(key, v, target); }});
}

// Every type a setting may have (FlagSet::add's comment).
template void FlagSet::add(std::string, std::string*, std::string);
template void FlagSet::add(std::string, bool*, std::string);
template void FlagSet::add(std::string, int*, std::string);
template void FlagSet::add(std::string, unsigned*, std::string);
template void FlagSet::add(std::string, long*, std::string);
template void FlagSet::add(std::string, unsigned long*, std::string);
template void FlagSet::add(std::string, long long*, std::string);
template void FlagSet::add(std::string, unsigned long long*, std::string);
template void FlagSet::add(std::string, uint16_t*, std::string);
template void FlagSet::add(std::string, double*, std::string);

}  // namespace farmem
