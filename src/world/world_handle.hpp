// What one rank of a process world sends every other rank: a CUDA IPC handle
// of its workspace and enough about the world to refuse a mismatched peer
// (another world size, layer, token split or ring; a rank on the same GPU)
// with a clear error instead of corrupting memory. Fixed-size plain bytes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "mok/error.hpp"

namespace mok::world {

inline constexpr uint32_t kHandleMagic = 0x574b4f4du;  // "MOKW"
inline constexpr uint32_t kHandleVersion = 1;

struct WorldHandle {
  uint32_t magic = kHandleMagic;
  uint32_t version = kHandleVersion;
  int32_t world_size = 0;
  int32_t rank = 0;
  uint64_t fingerprint = 0;  // layout_fingerprint() (workspace_layout.hpp)
  uint64_t bytes = 0;        // the exporter's workspace size
  uint8_t gpu_uuid[16] = {};
  cudaIpcMemHandle_t ipc{};
};

inline constexpr size_t kHandleBytes = sizeof(WorldHandle);

inline std::vector<uint8_t> pack_handle(const WorldHandle& handle) {
  std::vector<uint8_t> bytes(kHandleBytes);
  std::memcpy(bytes.data(), &handle, kHandleBytes);
  return bytes;
}

// Rank q's handle as this process received it; throws mok::Error on anything
// that is not a handle of this version.
inline WorldHandle unpack_handle(std::span<const uint8_t> bytes, int q) {
  const std::string who = "import_peers: handles[" + std::to_string(q) + "]";
  if (bytes.size() != kHandleBytes) {
    throw Error(who + " has " + std::to_string(bytes.size()) + " bytes; a handle from export_handle() has " +
                std::to_string(kHandleBytes));
  }
  WorldHandle handle;
  std::memcpy(&handle, bytes.data(), kHandleBytes);
  if (handle.magic != kHandleMagic || handle.version != kHandleVersion) {
    throw Error(who + " is not a mok process-world handle of this version (" + std::to_string(kHandleVersion) + ")");
  }
  return handle;
}

}  // namespace mok::world
