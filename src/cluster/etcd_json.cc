// Codec of etcd's v3 JSON gateway (see etcd_json.h). No exceptions escape: nlohmann is used in
// its non-throwing forms and every field's type is checked before it is read. Any thread.
#include "cluster/etcd_json.h"

#include <charconv>

namespace farmem::cluster::etcdjson {

namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int B64Value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

const Json* Field(const Json& obj, const char* name) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

}  // namespace

std::string Base64Encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    uint32_t v =
        (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8) | uint8_t(in[i + 2]);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i + 1 == in.size()) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    uint32_t v = (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

Result<std::string> Base64Decode(std::string_view in) {
  if (in.size() % 4 != 0) return Status::Protocol("etcd: base64 length not a multiple of 4");
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int j = 0; j < 4; ++j) {
      unsigned char c = static_cast<unsigned char>(in[i + j]);
      if (c == '=' && i + 4 == in.size() && j >= 2) {
        v[j] = 0;
        ++pad;
        continue;
      }
      if (pad > 0) return Status::Protocol("etcd: bad base64 padding");
      v[j] = B64Value(c);
      if (v[j] < 0) return Status::Protocol("etcd: bad base64 character");
    }
    uint32_t w =
        (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) | uint32_t(v[3]);
    out += static_cast<char>(w >> 16);
    if (pad < 2) out += static_cast<char>((w >> 8) & 0xff);
    if (pad < 1) out += static_cast<char>(w & 0xff);
  }
  return out;
}

std::string PrefixRangeEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    unsigned char last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();  // 0xff carries into the byte before it
  }
  return std::string(1, '\0');
}

Result<Json> Parse(std::string_view body, std::string_view what) {
  Json j = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    std::string head(body.substr(0, 120));
    return Status::Protocol("etcd " + std::string(what) + ": malformed JSON: " + head);
  }
  if (!j.is_object()) return Status::Protocol("etcd " + std::string(what) + ": not a JSON object");
  return j;
}

Result<int64_t> Int64(const Json& obj, const char* name) {
  const Json* f = Field(obj, name);
  if (f == nullptr) return int64_t{0};
  if (f->is_number_integer()) return f->get<int64_t>();
  if (f->is_number_unsigned()) {
    uint64_t u = f->get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return Status::Protocol("etcd: int64 out of range");
    return static_cast<int64_t>(u);
  }
  if (f->is_string()) {
    const std::string& s = f->get_ref<const std::string&>();
    int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || p != s.data() + s.size() || s.empty()) {
      return Status::Protocol(std::string("etcd: field ") + name +
                              " is not an int64: " + s.substr(0, 40));
    }
    return v;
  }
  return Status::Protocol(std::string("etcd: field ") + name + " has the wrong type");
}

Result<bool> Bool(const Json& obj, const char* name) {
  const Json* f = Field(obj, name);
  if (f == nullptr) return false;
  if (!f->is_boolean()) return Status::Protocol(std::string("etcd: field ") + name + " not a bool");
  return f->get<bool>();
}

Result<std::string> String(const Json& obj, const char* name) {
  const Json* f = Field(obj, name);
  if (f == nullptr) return std::string();
  if (!f->is_string()) {
    return Status::Protocol(std::string("etcd: field ") + name + " not a string");
  }
  return f->get<std::string>();
}

Result<std::string> Bytes(const Json& obj, const char* name) {
  FARMEM_ASSIGN_OR_RETURN(std::string s, String(obj, name));
  auto r = Base64Decode(s);
  if (!r.ok()) return r.status().WithContext(std::string("field ") + name);
  return r;
}

Result<int64_t> HeaderRevision(const Json& obj) {
  const Json* h = Field(obj, "header");
  if (h == nullptr) return int64_t{0};
  if (!h->is_object()) return Status::Protocol("etcd: header is not an object");
  return Int64(*h, "revision");
}

Result<BackendKv> ParseKv(const Json& kv) {
  if (!kv.is_object()) return Status::Protocol("etcd: kv is not an object");
  BackendKv out;
  FARMEM_ASSIGN_OR_RETURN(out.key, Bytes(kv, "key"));
  FARMEM_ASSIGN_OR_RETURN(out.value, Bytes(kv, "value"));
  FARMEM_ASSIGN_OR_RETURN(out.create_revision, Int64(kv, "create_revision"));
  FARMEM_ASSIGN_OR_RETURN(out.mod_revision, Int64(kv, "mod_revision"));
  FARMEM_ASSIGN_OR_RETURN(out.lease, Int64(kv, "lease"));
  return out;
}

Result<std::vector<BackendKv>> ParseKvs(const Json& obj) {
  std::vector<BackendKv> out;
  const Json* kvs = Field(obj, "kvs");
  if (kvs == nullptr) return out;
  if (!kvs->is_array()) return Status::Protocol("etcd: kvs is not an array");
  out.reserve(kvs->size());
  for (const Json& kv : *kvs) {
    FARMEM_ASSIGN_OR_RETURN(BackendKv k, ParseKv(kv));
    out.push_back(std::move(k));
  }
  return out;
}

Code CodeOfGrpc(int64_t grpc_code) {
  switch (grpc_code) {
    case 1:  // Canceled
      return Code::kAborted;
    case 3:  // InvalidArgument
      return Code::kInvalidArgument;
    case 4:  // DeadlineExceeded
      return Code::kTimedOut;
    case 5:  // NotFound
      return Code::kNotFound;
    case 6:  // AlreadyExists
    case 9:  // FailedPrecondition
      return Code::kFailedPrecondition;
    case 7:   // PermissionDenied
    case 16:  // Unauthenticated
      return Code::kPermissionDenied;
    case 8:  // ResourceExhausted
      return Code::kResourceExhausted;
    case 10:  // Aborted
      return Code::kAborted;
    case 11:  // OutOfRange (etcd: "required revision has been compacted")
      return Code::kOutOfRange;
    case 14:  // Unavailable (no leader, request timed out, stopping)
      return Code::kUnavailable;
    default:
      return Code::kInternal;
  }
}

Status ErrorOf(const Json& body, long http_status, std::string_view what) {
  const Json* err = Field(body, "error");
  std::string message;
  int64_t code = -1;
  if (err != nullptr && err->is_object()) {
    // grpc-gateway's stream error shape.
    auto m = String(*err, "message");
    if (m.ok()) message = *m;
    auto c = Int64(*err, "grpc_code");
    if (c.ok()) code = *c;
  } else if (err != nullptr && err->is_string() && http_status != 200) {
    auto m = String(body, "message");
    message = m.ok() && !m->empty() ? *m : err->get<std::string>();
    auto c = Int64(body, "code");
    if (c.ok()) code = *c;
  } else if (http_status == 200) {
    return Status::OK();
  }
  std::string prefix = "etcd " + std::string(what) + ": ";
  if (code < 0) {
    return Status::Protocol(prefix + "HTTP " + std::to_string(http_status) +
                            (message.empty() ? std::string() : " " + message));
  }
  // etcd reports a wrong password as InvalidArgument; to the caller it is a refusal.
  if (message.find("authentication failed") != std::string::npos) {
    return Status::PermissionDenied(prefix + message);
  }
  if (message.find("user name is empty") != std::string::npos) {
    return Status::PermissionDenied(prefix + message +
                                    " (etcd has auth enabled: set user/password)");
  }
  return Status(CodeOfGrpc(code), prefix + message);
}

bool IsAuthTokenError(std::string_view message) {
  return message.find("invalid auth token") != std::string_view::npos ||
         message.find("user name is empty") != std::string_view::npos ||
         message.find("auth: revision in header is old") != std::string_view::npos;
}

}  // namespace farmem::cluster::etcdjson
