// The process world: one process per GPU (e.g. under torchrun); this object
// is one rank, on the current GPU. It allocates only its own workspace, in
// which the pass kind stages the inputs its peers read (the caller's tensors
// cannot be shared: stages_inputs), exports it as a CUDA IPC handle and maps
// its peers' from theirs (what it needs of the pass kind:
// WorkspaceExchange). Passes are always device-ordered: no host can order
// the processes' GPUs.
#include <cstring>
#include <string>

#include "common/cuda_check.hpp"
#include "mok/error.hpp"
#include "world/device_scope.hpp"
#include "world/world.hpp"
#include "world/world_handle.hpp"

namespace mok::world {
namespace {

class ProcessWorld final : public World {
 public:
  ~ProcessWorld() override {
    if (mapped_.empty() || core_ == nullptr) return;
    // A pass still running would touch the peers' memory: let it end first.
    try {
      DeviceScope on(core_->rank_device[static_cast<size_t>(me_)]);
      cudaDeviceSynchronize();
      close_mappings(*core_);
    } catch (...) {
    }
  }

  bool allocates(int rank) const override { return rank == me_; }

  std::vector<Launch> launches(const WorldCore& s) const override {
    return {Launch{s.rank_device[static_cast<size_t>(me_)], me_, 1}};
  }

  void connect(WorldCore& s) override {
    core_ = &s;
    me_ = s.process_rank;
  }

  bool ready_to_run(const WorldCore& s) const override { return s.world_size == 1 || imported_; }

  bool stages_inputs() const override { return true; }

  std::vector<uint8_t> export_handle(const WorldCore& s, const WorkspaceExchange& exchange) const override {
    WorldHandle handle;
    handle.world_size = s.world_size;
    handle.rank = me_;
    handle.fingerprint = exchange.fingerprint;
    handle.bytes = exchange.bytes[static_cast<size_t>(me_)];
    cudaDeviceProp prop{};
    MOK_CUDA_CHECK(cudaGetDeviceProperties(&prop, s.rank_device[static_cast<size_t>(me_)]));
    std::memcpy(handle.gpu_uuid, &prop.uuid, sizeof(handle.gpu_uuid));
    DeviceScope on(s.rank_device[static_cast<size_t>(me_)]);
    MOK_CUDA_CHECK(cudaIpcGetMemHandle(&handle.ipc, s.rank_memory[static_cast<size_t>(me_)]));
    return pack_handle(handle);
  }

  void import_peers(WorldCore& s, const WorkspaceExchange& exchange,
                    std::span<const std::vector<uint8_t>> handles) override {
    const int R = s.world_size;
    if (imported_) throw Error("import_peers: the peers are imported already (once per object)");
    if (static_cast<int>(handles.size()) != R) {
      throw Error("import_peers: got " + std::to_string(handles.size()) + " handles; world_size is " +
                  std::to_string(R) + " (one per rank, in rank order, this rank's included)");
    }
    const std::vector<WorldHandle> peers = checked_handles(s, exchange, handles);
    DeviceScope on(s.rank_device[static_cast<size_t>(me_)]);
    try {
      for (int q = 0; q < R; ++q) {
        if (q == me_) continue;
        void* base = nullptr;
        // IPC memory needs no cudaDeviceEnablePeerAccess: the lazy flag maps
        // it for peer access (NVLink or PCIe P2P).
        MOK_CUDA_CHECK(cudaIpcOpenMemHandle(&base, peers[static_cast<size_t>(q)].ipc, cudaIpcMemLazyEnablePeerAccess));
        s.rank_base[static_cast<size_t>(q)] = static_cast<uint8_t*>(base);
        mapped_.push_back(q);
        exchange.mapped(q);
      }
    } catch (...) {
      close_mappings(s);
      throw;
    }
    imported_ = true;
  }

  void close_peers(WorldCore& s, const WorkspaceExchange& exchange) override {
    DeviceScope on(s.rank_device[static_cast<size_t>(me_)]);
    // No pass of ours may still read or write the mappings.
    MOK_CUDA_CHECK(cudaDeviceSynchronize());
    if (!mapped_.empty()) exchange.closing();
    close_mappings(s);
  }

 private:
  std::vector<WorldHandle> checked_handles(const WorldCore& s, const WorkspaceExchange& exchange,
                                          std::span<const std::vector<uint8_t>> handles) const {
    const int R = s.world_size;
    cudaDeviceProp prop{};
    MOK_CUDA_CHECK(cudaGetDeviceProperties(&prop, s.rank_device[static_cast<size_t>(me_)]));
    const uint64_t fingerprint = exchange.fingerprint;
    std::vector<WorldHandle> peers;
    for (int q = 0; q < R; ++q) {
      const WorldHandle h = unpack_handle(handles[static_cast<size_t>(q)], q);
      const std::string who = "import_peers: handles[" + std::to_string(q) + "]";
      if (h.world_size != R) {
        throw Error(who + " comes from a world of " + std::to_string(h.world_size) + " ranks; this one has " +
                    std::to_string(R));
      }
      if (h.rank != q) {
        throw Error(who + " is rank " + std::to_string(h.rank) + "'s handle (give them in rank order)");
      }
      if (h.fingerprint != fingerprint || h.bytes != exchange.bytes[static_cast<size_t>(q)]) {
        throw Error(who + ": rank " + std::to_string(q) + " was made with another layer config or options "
                    "(dims, tokens per rank, minibatch_rows, ring_slots, comm_ctas_per_rank must be equal on every "
                    "rank), or is another pass's workspace (a forward's and a backward's handles do not mix)");
      }
      if (q != me_ && std::memcmp(h.gpu_uuid, &prop.uuid, sizeof(h.gpu_uuid)) == 0) {
        throw Error(who + ": rank " + std::to_string(q) + " runs on this process's GPU too; a process world "
                    "needs one GPU per rank (each pass needs every SM of its GPU)");
      }
      peers.push_back(h);
    }
    return peers;
  }

  void close_mappings(WorldCore& s) {
    for (int q : mapped_) {
      cudaIpcCloseMemHandle(s.rank_base[static_cast<size_t>(q)]);
      s.rank_base[static_cast<size_t>(q)] = nullptr;
    }
    mapped_.clear();
    imported_ = false;
  }

  WorldCore* core_ = nullptr;
  int me_ = -1;
  std::vector<int> mapped_;  // ranks whose workspace is an IPC mapping (closed, not freed)
  bool imported_ = false;
};

}  // namespace

std::unique_ptr<World> make_process_world() { return std::make_unique<ProcessWorld>(); }

}  // namespace mok::world
