// Pure helpers of ObjectClient that need no network: decoding/validating the OBJ_INFO reply and
// checking a pointer's shape against a server's geometry. Separate so unit tests can feed them
// malformed input directly (a lying or buggy server must produce Protocol errors, not UB).
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

#include "farmem/objects.h"
#include "farmem/status.h"

namespace farmem::objects_internal {

// Decodes an OBJ_INFO reply (InfoReply + WireClass entries) and checks that the geometry is one
// this client can read one-sidedly: block size, id_bits, slot sizes ascending, payload capacity
// equal to this build's slot layout, ID masks. Protocol error (with `server` in the message) if
// not. Sets every field except `name`.
Result<ObjectServerInfo> DecodeInfoReply(std::span<const std::byte> reply, std::string_view server);

// InvalidArgument unless `p` is a valid pointer whose class, offset and ID fit `info`: class
// index in range, slot inside the region, on a slot boundary of its class inside its block, ID
// within the class's mask. `op` prefixes the message. Does not check p.server.
Status CheckPtrShape(const ObjectServerInfo& info, const Ptr& p, std::string_view op);

}  // namespace farmem::objects_internal
