// torch.ops.mok.process_world_*: one rank of a process world (one process per
// GPU, e.g. under torchrun) as PyTorch custom ops. python/mok/distributed.py
// drives them: create the rank's object, export its handle as a uint8 CPU
// tensor, all-gather the handles over torch.distributed, import them, run.
// The object lives in a registry here and is named by an integer id.
//
// Errors: like fused_forward_ops.cpp, no C++ exception crosses the
// dispatcher and no integer is ever formatted through an ostream (both
// crashed inside torch 2.11's process): an op that fails returns a
// sentinel (0, false, an empty tensor or list) and leaves the message for
// torch.ops.mok.process_world_error(), which python raises as RuntimeError.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mok/error.hpp"
#include "mok/fused_forward.hpp"
#include "mok/layer_config.hpp"
#include "op_checks.hpp"

namespace {

using mok::torch_ops::check_shape;
using mok::torch_ops::expect;
using mok::torch_ops::num;

std::string& error_message() {
  thread_local std::string message;
  return message;
}

// One rank's object and what its tensors must look like.
struct World {
  mok::LayerConfig config;
  int rank = 0;
  int device = 0;
  std::unique_ptr<mok::FusedForward> forward;
};

std::mutex registry_mutex;
std::map<int64_t, std::shared_ptr<World>> registry;
int64_t next_id = 1;

std::shared_ptr<World> find(int64_t id) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = registry.find(id);
  expect(it != registry.end(), "no process world with id " + num(id) + " (destroyed, or never created)");
  return it->second;
}

// Runs `body`, turning any exception into the sentinel and the message.
template <class Result, class Body>
Result guarded(Result failed, Body&& body) {
  return mok::torch_ops::guarded(error_message(), std::move(failed), std::forward<Body>(body));
}

void check(const at::Tensor& t, const std::string& name, at::ScalarType dtype, int64_t dim, const at::Device& device) {
  mok::torch_ops::check_tensor(t, name, dtype, dim, device, "this rank's world is on");
}

int64_t create(int64_t rank, at::IntArrayRef tokens_per_rank, int64_t hidden, int64_t intermediate,
               int64_t num_experts, int64_t top_k, int64_t shared_intermediate, int64_t minibatch_rows,
               int64_t ring_slots, int64_t ctas_per_rank, int64_t comm_ctas_per_rank, int64_t lookahead,
               double timeout_seconds, double barrier_timeout_seconds, int64_t device) {
  return guarded<int64_t>(0, [&]() -> int64_t {
    auto world = std::make_shared<World>();
    mok::LayerConfig& c = world->config;
    c.hidden = static_cast<int>(hidden);
    c.intermediate = static_cast<int>(intermediate);
    c.num_experts = static_cast<int>(num_experts);
    c.top_k = static_cast<int>(top_k);
    c.world_size = static_cast<int>(tokens_per_rank.size());
    c.num_shared_experts = shared_intermediate > 0 ? 1 : 0;
    c.shared_intermediate = static_cast<int>(shared_intermediate);
    for (int64_t t : tokens_per_rank) c.tokens_per_rank.push_back(static_cast<int>(t));
    mok::FusedForwardOptions o =
        mok::torch_ops::tuning_options(minibatch_rows, ring_slots, ctas_per_rank, comm_ctas_per_rank, lookahead);
    o.process_rank = static_cast<int>(rank);
    o.timeout_seconds = timeout_seconds;
    o.barrier_timeout_seconds = barrier_timeout_seconds;
    world->rank = static_cast<int>(rank);
    world->device = static_cast<int>(device);
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    world->forward = std::make_unique<mok::FusedForward>(c, o);  // validates config and options
    std::lock_guard<std::mutex> lock(registry_mutex);
    const int64_t id = next_id++;
    registry[id] = world;
    return id;
  });
}

at::Tensor export_handle(int64_t id) {
  return guarded<at::Tensor>(at::empty({0}, at::kByte), [&] {
    auto world = find(id);
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(world->device));
    const std::vector<uint8_t> bytes = world->forward->export_handle();
    at::Tensor out = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
    std::memcpy(out.data_ptr<uint8_t>(), bytes.data(), bytes.size());
    return out;
  });
}

bool import_handles(int64_t id, const at::Tensor& handles) {
  return guarded<bool>(false, [&] {
    auto world = find(id);
    expect(handles.defined() && handles.device().is_cpu() && handles.scalar_type() == at::kByte && handles.dim() == 2,
           "handles must be a uint8 CPU tensor [world_size, handle bytes] (row q: rank q's export)");
    const at::Tensor rows = handles.contiguous();
    std::vector<std::vector<uint8_t>> list;
    for (int64_t q = 0; q < rows.size(0); ++q) {
      const uint8_t* p = rows.data_ptr<uint8_t>() + q * rows.size(1);
      list.emplace_back(p, p + rows.size(1));
    }
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(world->device));
    world->forward->import_peers(list);
    return true;
  });
}

std::vector<at::Tensor> run(int64_t id, const at::Tensor& x, const at::Tensor& expert_ids, const at::Tensor& weights,
                            const at::Tensor& w13, const at::Tensor& w2, const std::optional<at::Tensor>& shared_w13,
                            const std::optional<at::Tensor>& shared_w2, bool check_errors) {
  return guarded<std::vector<at::Tensor>>({}, [&] {
    auto world = find(id);
    const mok::LayerConfig& c = world->config;
    const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(world->device));
    const int64_t T = c.tokens_per_rank[world->rank], H = c.hidden, I = c.intermediate, k = c.top_k;
    const int64_t El = c.experts_per_rank(), S = c.shared_width();
    check(x, "x", at::kBFloat16, 2, device);
    check(expert_ids, "expert_ids", at::kInt, 2, device);
    check(weights, "weights", at::kFloat, 2, device);
    check(w13, "w13", at::kBFloat16, 3, device);
    check(w2, "w2", at::kBFloat16, 3, device);
    check_shape(x, "x (this rank's tokens; the world was made with " + num(T) + ")", {T, H});
    check_shape(expert_ids, "expert_ids", {T, k});
    check_shape(weights, "weights", {T, k});
    check_shape(w13, "w13 (this rank's experts, [E/R, 2I, H])", {El, 2 * I, H});
    check_shape(w2, "w2 (this rank's experts, [E/R, H, I])", {El, H, I});
    const bool has_shared = shared_w13.has_value() && shared_w13->defined();
    expect(has_shared == (shared_w2.has_value() && shared_w2->defined()), "give both shared_w13 and shared_w2, or neither");
    expect(has_shared == (S > 0), S > 0 ? "this world has a shared expert: give shared_w13 and shared_w2"
                                        : "this world has no shared expert: give no shared_w13 or shared_w2");
    if (has_shared) {
      check(*shared_w13, "shared_w13", at::kBFloat16, 2, device);
      check(*shared_w2, "shared_w2", at::kBFloat16, 2, device);
      check_shape(*shared_w13, "shared_w13", {2 * S, H});
      check_shape(*shared_w2, "shared_w2", {H, S});
    }
    const c10::cuda::CUDAGuard guard(device);
    at::Tensor out = at::empty_like(x);
    mok::RankTensors t;
    t.x = x.data_ptr();
    t.expert_ids = expert_ids.data_ptr<int32_t>();
    t.weights = weights.data_ptr<float>();
    t.out = out.data_ptr();
    t.w13 = w13.data_ptr();
    t.w2 = w2.data_ptr();
    t.shared_w13 = has_shared ? shared_w13->data_ptr() : nullptr;
    t.shared_w2 = has_shared ? shared_w2->data_ptr() : nullptr;
    auto stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
    world->forward->run(t, stream);
    if (check_errors) world->forward->check(stream);
    return std::vector<at::Tensor>{out};
  });
}

bool close_peers(int64_t id) {
  return guarded<bool>(false, [&] {
    auto world = find(id);
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(world->device));
    if (world->config.world_size > 1) world->forward->close_peers();
    return true;
  });
}

bool destroy(int64_t id) {
  return guarded<bool>(false, [&] {
    std::shared_ptr<World> world = find(id);
    {
      std::lock_guard<std::mutex> lock(registry_mutex);
      registry.erase(id);
    }
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(world->device));
    world->forward.reset();
    return true;
  });
}

std::string process_world_error() { return error_message(); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(mok, m) {
  m.def(
      "process_world_create(int rank, int[] tokens_per_rank, int hidden, int intermediate, int num_experts, "
      "int top_k, int shared_intermediate, int minibatch_rows, int ring_slots, int ctas_per_rank, "
      "int comm_ctas_per_rank, int lookahead, float timeout_seconds, float barrier_timeout_seconds, "
      "int device) -> int",
      &create);
  m.def("process_world_export(int id) -> Tensor", &export_handle);
  m.def("process_world_import(int id, Tensor handles) -> bool", &import_handles);
  m.def(
      "process_world_run(int id, Tensor x, Tensor expert_ids, Tensor weights, Tensor w13, Tensor w2, "
      "Tensor? shared_w13, Tensor? shared_w2, bool check_errors=False) -> Tensor[]",
      &run);
  m.def("process_world_close_peers(int id) -> bool", &close_peers);
  m.def("process_world_destroy(int id) -> bool", &destroy);
  m.def("process_world_error() -> str", &process_world_error);
}
