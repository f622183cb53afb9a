// torch.ops.mok.process_world_*: one rank of a process world (one process per
// GPU, e.g. under torchrun) as PyTorch custom ops. python/mok/distributed.py
// drives them: create the rank's object, export its handle as a uint8 CPU
// tensor, all-gather the handles over torch.distributed, import them, run.
// With `fused_backward` the rank also holds a fused backward object
// (mok::FusedBackward, recompute mode: the forward keeps its schedule in a
// pass-state tensor the caller passes to both ops), whose workspace handles
// are exchanged the same way (`backward=True`). The objects live in a
// registry here and are named by an integer id. Errors follow op_errors.hpp;
// process_world_run also has a Meta kernel.
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
#include <vector>

#include "mok/fused_backward.hpp"
#include "mok/fused_forward.hpp"
#include "forward_tensors.hpp"
#include "mok/layer_config.hpp"
#include "op_checks.hpp"
#include "op_errors.hpp"
#include "tuning_options.hpp"

namespace {

using mok::torch_ops::check_shape;
using mok::torch_ops::check_tensor;
using mok::torch_ops::checked_int;
using mok::torch_ops::expect;
using mok::torch_ops::num;
using mok::torch_ops::raising_torch_errors;
using mok::torch_ops::kActivations, mok::torch_ops::kExpertIds, mok::torch_ops::kRoutingWeights,
    mok::torch_ops::kExpertWeights, mok::torch_ops::kSharedWeights;

// One rank's object and what its tensors must look like. `mutex` makes every
// call on the object one at a time (run() reuses the workspace and host-side
// state; close_peers() unmaps what a pass reads).
struct World {
  mok::LayerConfig config;
  int rank = 0;
  int device = 0;
  std::mutex mutex;
  std::unique_ptr<mok::FusedForward> forward;
  std::unique_ptr<mok::FusedBackward> backward;  // with fused_backward only
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

int64_t create(int64_t rank, at::IntArrayRef tokens_per_rank, int64_t hidden, int64_t intermediate,
               int64_t num_experts, int64_t top_k, int64_t shared_intermediate, at::IntArrayRef tuning,
               double timeout_seconds, double barrier_timeout_seconds, int64_t device, bool fused_backward) {
  auto world = std::make_shared<World>();
  mok::LayerConfig& c = world->config;
  c.hidden = checked_int(hidden, "hidden");
  c.intermediate = checked_int(intermediate, "intermediate");
  c.num_experts = checked_int(num_experts, "num_experts");
  c.top_k = checked_int(top_k, "top_k");
  c.world_size = checked_int(static_cast<int64_t>(tokens_per_rank.size()), "len(tokens_per_rank)");
  c.num_shared_experts = shared_intermediate > 0 ? 1 : 0;
  c.shared_intermediate = checked_int(shared_intermediate, "shared_intermediate");
  for (size_t r = 0; r < tokens_per_rank.size(); ++r) {
    c.tokens_per_rank.push_back(checked_int(tokens_per_rank[r], "tokens_per_rank[" + num(static_cast<int64_t>(r)) + "]"));
  }
  mok::FusedForwardOptions o = mok::torch_ops::forward_options(mok::torch_ops::tuning_values(tuning));
  o.process_rank = checked_int(rank, "rank");
  o.timeout_seconds = timeout_seconds;
  o.barrier_timeout_seconds = barrier_timeout_seconds;
  world->rank = o.process_rank;
  world->device = checked_int(device, "device");
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(world->device));
  // Validates config and options.
  raising_torch_errors([&] {
    world->forward = std::make_unique<mok::FusedForward>(c, o);
    if (fused_backward) world->backward = std::make_unique<mok::FusedBackward>(c, o, mok::BackwardMode::kRecompute);
  });
  std::lock_guard<std::mutex> lock(registry_mutex);
  const int64_t id = next_id++;
  registry[id] = world;
  return id;
}

// The world's fused backward object, or a clear error if it was made without one.
mok::FusedBackward& backward_of(World& world) {
  expect(world.backward != nullptr, "this process world was made without the fused backward (fused_backward=False)");
  return *world.backward;
}

at::Tensor export_handle(int64_t id, bool backward) {
  auto world = find(id);
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(world->device));
  const std::vector<uint8_t> bytes = raising_torch_errors([&] {
    const std::lock_guard<std::mutex> lock(world->mutex);
    return backward ? backward_of(*world).export_handle() : world->forward->export_handle();
  });
  at::Tensor out = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  std::memcpy(out.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  return out;
}

void import_handles(int64_t id, const at::Tensor& handles, bool backward) {
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
  raising_torch_errors([&] {
    const std::lock_guard<std::mutex> lock(world->mutex);
    if (backward) {
      backward_of(*world).import_peers(list);
    } else {
      world->forward->import_peers(list);
    }
  });
}

// This rank's tensors against the world it was made for; returns whether the
// shared expert is given. `device` is the world's GPU (or meta, for fakes).
bool check_arguments(const World& world, const at::Device& device, const at::Tensor& x,
                     const at::Tensor& expert_ids, const at::Tensor& weights, const at::Tensor& w13,
                     const at::Tensor& w2, const std::optional<at::Tensor>& shared_w13,
                     const std::optional<at::Tensor>& shared_w2) {
  const mok::LayerConfig& c = world.config;
  const int64_t T = c.tokens_per_rank[world.rank], H = c.hidden, I = c.intermediate, k = c.top_k;
  const int64_t El = c.experts_per_rank(), S = c.shared_width();
  const std::string on = "this rank's world is on";
  check_tensor(x, "x", kActivations, device, on);
  check_tensor(expert_ids, "expert_ids", kExpertIds, device, on);
  check_tensor(weights, "weights", kRoutingWeights, device, on);
  check_tensor(w13, "w13", kExpertWeights, device, on);
  check_tensor(w2, "w2", kExpertWeights, device, on);
  check_shape(x, "x (this rank's tokens; the world was made with " + num(T) + ")", {T, H});
  check_shape(expert_ids, "expert_ids", {T, k}, "[T, k]");
  check_shape(weights, "weights", {T, k}, "[T, k]");
  check_shape(w13, "w13 (this rank's experts)", {El, 2 * I, H}, "[E/R, 2I, H]");
  check_shape(w2, "w2 (this rank's experts)", {El, H, I}, "[E/R, H, I]");
  const bool has_shared = shared_w13.has_value() && shared_w13->defined();
  expect(has_shared == (shared_w2.has_value() && shared_w2->defined()), "give both shared_w13 and shared_w2, or neither");
  expect(has_shared == (S > 0), S > 0 ? "this world has a shared expert: give shared_w13 and shared_w2"
                                      : "this world has no shared expert: give no shared_w13 or shared_w2");
  if (has_shared) {
    check_tensor(*shared_w13, "shared_w13", kSharedWeights, device, on);
    check_tensor(*shared_w2, "shared_w2", kSharedWeights, device, on);
    check_shape(*shared_w13, "shared_w13", {2 * S, H}, "[2S, H]");
    check_shape(*shared_w2, "shared_w2", {H, S}, "[H, S]");
  }
  return has_shared;
}

// A pass state for this world's passes: uint8, FusedForward::pass_state_bytes().
void check_pass_state(const World& world, const at::Tensor& pass_state, const at::Device& device) {
  const int64_t bytes = static_cast<int64_t>(world.forward->pass_state_bytes());
  expect(pass_state.defined() && pass_state.device() == device && pass_state.scalar_type() == at::kByte &&
             pass_state.dim() == 1 && pass_state.numel() == bytes && pass_state.is_contiguous(),
         "pass_state must be a contiguous uint8 tensor of " + num(bytes) + " bytes on " + device.str() +
             " (process_world_pass_state_bytes)");
}

// One pass; with `pass_state`, its schedule kept there for the fused backward.
at::Tensor run_pass(int64_t id, const at::Tensor& x, const at::Tensor& expert_ids, const at::Tensor& weights,
                    const at::Tensor& w13, const at::Tensor& w2, const std::optional<at::Tensor>& shared_w13,
                    const std::optional<at::Tensor>& shared_w2, bool check_errors, const at::Tensor* pass_state) {
  auto world = find(id);
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(world->device));
  const bool has_shared = check_arguments(*world, device, x, expert_ids, weights, w13, w2, shared_w13, shared_w2);
  const bool keeps_state = pass_state != nullptr;
  if (keeps_state) check_pass_state(*world, *pass_state, device);
  const c10::cuda::CUDAGuard guard(device);
  at::Tensor out = at::empty_like(x);
  mok::RankTensors t =
      mok::torch_ops::rank_tensors(x, expert_ids, weights, w13, w2, shared_w13, shared_w2, has_shared, out);
  // The schedule of this pass, for the fused backward.
  if (keeps_state) t.pass_state = pass_state->data_ptr();
  raising_torch_errors([&] {
    auto stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
    const std::lock_guard<std::mutex> lock(world->mutex);
    world->forward->run(t, stream);
    if (check_errors) world->forward->check(stream);
  });
  return out;
}

at::Tensor run(int64_t id, const at::Tensor& x, const at::Tensor& expert_ids, const at::Tensor& weights,
               const at::Tensor& w13, const at::Tensor& w2, const std::optional<at::Tensor>& shared_w13,
               const std::optional<at::Tensor>& shared_w2, bool check_errors) {
  return run_pass(id, x, expert_ids, weights, w13, w2, shared_w13, shared_w2, check_errors, nullptr);
}

// The pass of a world with the fused backward: it also writes its schedule
// into `pass_state` (a mutating op of its own: register_autograd takes only
// functional schemas, and mok.distributed's layer owns the autograd).
at::Tensor run_keeping_schedule(int64_t id, const at::Tensor& x, const at::Tensor& expert_ids,
                                const at::Tensor& weights, const at::Tensor& w13, const at::Tensor& w2,
                                const std::optional<at::Tensor>& shared_w13,
                                const std::optional<at::Tensor>& shared_w2, at::Tensor& pass_state,
                                bool check_errors) {
  return run_pass(id, x, expert_ids, weights, w13, w2, shared_w13, shared_w2, check_errors, &pass_state);
}

at::Tensor run_meta(int64_t id, const at::Tensor& x, const at::Tensor& expert_ids, const at::Tensor& weights,
                    const at::Tensor& w13, const at::Tensor& w2, const std::optional<at::Tensor>& shared_w13,
                    const std::optional<at::Tensor>& shared_w2, bool /*check_errors*/) {
  check_arguments(*find(id), x.device(), x, expert_ids, weights, w13, w2, shared_w13, shared_w2);
  return at::empty_like(x);
}

int64_t pass_state_bytes(int64_t id) { return static_cast<int64_t>(find(id)->forward->pass_state_bytes()); }

// This rank's gradients from the fused backward kernel (recompute mode: it
// recomputes gate/up from the pulled x rows), over the schedule the forward
// kept in `pass_state`: dx [T, H] bf16, dweights [T, k] fp32, dw13 and dw2
// of this rank's experts and this rank's part of the shared expert's (bf16,
// each rounded once from its fp32 sum; empty without a shared expert).
// Collective: every rank must run it for the same pass.
std::vector<at::Tensor> run_backward(int64_t id, const at::Tensor& dout, const at::Tensor& x,
                                     const at::Tensor& expert_ids, const at::Tensor& weights, const at::Tensor& w13,
                                     const at::Tensor& w2, const std::optional<at::Tensor>& shared_w13,
                                     const std::optional<at::Tensor>& shared_w2, const at::Tensor& pass_state,
                                     bool check_errors) {
  auto world = find(id);
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(world->device));
  mok::FusedBackward& backward = backward_of(*world);
  const bool has_shared = check_arguments(*world, device, x, expert_ids, weights, w13, w2, shared_w13, shared_w2);
  check_tensor(dout, "dout", kActivations, device, "this rank's world is on");
  check_shape(dout, "dout", {x.size(0), x.size(1)}, "[T, H], as x");
  check_pass_state(*world, pass_state, device);
  const c10::cuda::CUDAGuard guard(device);
  at::Tensor dx = at::empty_like(x);
  at::Tensor dweights = at::empty_like(weights);
  at::Tensor dw13 = at::empty_like(w13), dw2 = at::empty_like(w2);
  at::Tensor dshared_w13 = has_shared ? at::empty_like(*shared_w13) : at::empty({0}, x.options());
  at::Tensor dshared_w2 = has_shared ? at::empty_like(*shared_w2) : at::empty({0}, x.options());
  mok::BackwardRankTensors b;
  b.x = x.data_ptr();
  b.weights = weights.data_ptr<float>();
  b.w13 = w13.data_ptr();
  b.w2 = w2.data_ptr();
  b.shared_w13 = has_shared ? shared_w13->data_ptr() : nullptr;
  b.shared_w2 = has_shared ? shared_w2->data_ptr() : nullptr;
  b.pass_state = pass_state.data_ptr();
  b.dout = dout.data_ptr();
  b.dx = dx.data_ptr();
  b.dweights = dweights.data_ptr<float>();
  b.dw13 = dw13.data_ptr();
  b.dw2 = dw2.data_ptr();
  b.dshared_w13 = has_shared ? dshared_w13.data_ptr() : nullptr;
  b.dshared_w2 = has_shared ? dshared_w2.data_ptr() : nullptr;
  raising_torch_errors([&] {
    auto stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
    const std::lock_guard<std::mutex> lock(world->mutex);
    backward.run(b, stream, mok::WeightGradOutput::kBf16);
    if (check_errors) backward.check(stream);
  });
  return {dx, dweights, dw13, dw2, dshared_w13, dshared_w2};
}

void close_peers(int64_t id) {
  auto world = find(id);
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(world->device));
  if (world->config.world_size > 1) {
    raising_torch_errors([&] {
      // Not while another thread's pass still reads the peers' mappings.
      const std::lock_guard<std::mutex> lock(world->mutex);
      world->forward->close_peers();
      if (world->backward != nullptr) world->backward->close_peers();
    });
  }
}

void destroy(int64_t id) {
  std::shared_ptr<World> world = find(id);
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    registry.erase(id);
  }
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(world->device));
  const std::lock_guard<std::mutex> lock(world->mutex);
  world->backward.reset();
  world->forward.reset();
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mok, m) {
  m.def(
      "process_world_create(int rank, int[] tokens_per_rank, int hidden, int intermediate, int num_experts, "
      "int top_k, int shared_intermediate, int[] tuning, float timeout_seconds, float barrier_timeout_seconds, "
      "int device, bool fused_backward=False) -> int",
      &create);
  m.def("process_world_export(int id, bool backward=False) -> Tensor", &export_handle);
  m.def("process_world_import(int id, Tensor handles, bool backward=False) -> ()", &import_handles);
  m.def(
      "process_world_run(int id, Tensor x, Tensor expert_ids, Tensor weights, Tensor w13, Tensor w2, "
      "Tensor? shared_w13, Tensor? shared_w2, bool check_errors=False) -> Tensor");
  m.def(
      "process_world_run_keeping_schedule(int id, Tensor x, Tensor expert_ids, Tensor weights, Tensor w13, "
      "Tensor w2, Tensor? shared_w13, Tensor? shared_w2, Tensor(a!) pass_state, bool check_errors=False) -> Tensor");
  m.def("process_world_pass_state_bytes(int id) -> int", &pass_state_bytes);
  m.def(
      "process_world_backward(int id, Tensor dout, Tensor x, Tensor expert_ids, Tensor weights, Tensor w13, "
      "Tensor w2, Tensor? shared_w13, Tensor? shared_w2, Tensor pass_state, bool check_errors=False) -> Tensor[]",
      &run_backward);
  m.def("process_world_close_peers(int id) -> ()", &close_peers);
  m.def("process_world_destroy(int id) -> ()", &destroy);
}

TORCH_LIBRARY_IMPL(mok, CUDA, m) {
  m.impl("process_world_run", &run);
  m.impl("process_world_run_keeping_schedule", &run_keeping_schedule);
}
TORCH_LIBRARY_IMPL(mok, Meta, m) { m.impl("process_world_run", &run_meta); }
// CPU tensors reach the same checks, which refuse them by name.
TORCH_LIBRARY_IMPL(mok, CPU, m) {
  m.impl("process_world_run", &run);
  m.impl("process_world_run_keeping_schedule", &run_keeping_schedule);
}
