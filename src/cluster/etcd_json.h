// The etcd v3 JSON gateway's encoding: base64 keys/values, int64s as strings, missing fields as
// zero, {"error","code","message"} bodies mapped to Status. Pure functions, any thread.
// Every response is untrusted: a field of the wrong type or bad base64 is a Protocol error.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cluster/backend.h"
#include "farmem/status.h"

namespace farmem::cluster::etcdjson {

using Json = nlohmann::json;

std::string Base64Encode(std::string_view in);
// Standard alphabet with padding (what the gateway emits); anything else is Protocol.
Result<std::string> Base64Decode(std::string_view in);

// The range_end that selects every key starting with `prefix`: the prefix with its last byte
// incremented, dropping trailing 0xff bytes first; "\0" (to the end of the keyspace) when the
// prefix is empty or all 0xff.
std::string PrefixRangeEnd(std::string_view prefix);

// Parses a body; a malformed one is Protocol (naming `what`).
Result<Json> Parse(std::string_view body, std::string_view what);

// obj[name] as int64: missing/null is 0; a decimal string or a JSON integer is accepted.
Result<int64_t> Int64(const Json& obj, const char* name);
// obj[name] as bool: missing is false.
Result<bool> Bool(const Json& obj, const char* name);
// obj[name] as a string: missing is "".
Result<std::string> String(const Json& obj, const char* name);
// obj[name] base64-decoded: missing is "".
Result<std::string> Bytes(const Json& obj, const char* name);
// header.revision of a response (0 if missing).
Result<int64_t> HeaderRevision(const Json& obj);

// A mvccpb.KeyValue object.
Result<BackendKv> ParseKv(const Json& kv);
// The "kvs" array of a RangeResponse (missing: none).
Result<std::vector<BackendKv>> ParseKvs(const Json& obj);

// The error in a gateway body, if any: a unary error {"error":"..","code":N,"message":".."} or a
// stream error {"error":{"grpc_code":N,"message":".."}}. OK when the body is not an error.
// `http_status` != 200 without a recognizable error body is an error too.
Status ErrorOf(const Json& body, long http_status, std::string_view what);

// gRPC status code -> farmem Code (e.g. 5 NotFound, 7/16 PermissionDenied, 14 Unavailable).
Code CodeOfGrpc(int64_t grpc_code);

// True for the errors after which a fresh token should be fetched (token expired or lost by an
// etcd restart, or sent without one).
bool IsAuthTokenError(std::string_view message);

}  // namespace farmem::cluster::etcdjson
