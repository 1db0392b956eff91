// client_names.h: which chunk-manager client is which (a model's "torch0",
// an optimizer's "adam#0"), so memory_stats_json() can show each one's chunk
// figures. Private to hooks/torch; no torch headers.
#pragma once

#include <string>

#include "allocator/chunk/chunk_manager.h"

namespace spillway::torch_bridge {

// `kind` with the next free "#n" appended ("adam#0", "GPT#1"): the name of a
// client the bridge is about to add, unique in the process.
std::string unique_client_name(const std::string& kind);

// Remembers the name the bridge gave a client it added.
void name_client(ClientId client, std::string name);
// The name the bridge gave `client`; "client <id>" when it gave none.
std::string client_name(ClientId client);

// The name `chunks` knows `tensor` by (a parameter's "layer.weight"); "?"
// when it knows none.
std::string tensor_name(const ChunkManager& chunks, TensorId tensor);

// `stats_json` (a JSON object) with a "clients" object added: for each named
// client that still holds chunks, its chunk_bytes.device|host,
// bytes_moved.h2d|d2h and evictions (the contract keys' names).
std::string add_client_stats(const std::string& stats_json, const ChunkManager& chunks);

}  // namespace spillway::torch_bridge
