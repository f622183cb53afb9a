// torch.ops.mok.fused_backward: the fused backward kernel (mok::FusedBackward,
// include/mok/fused_backward.hpp) over a virtual world of R ranks on one GPU,
// in save or recompute mode: it reads what torch.ops.mok.fused_forward_train
// kept. Rank r's tensors are entry r of each list, as for the forward:
//   x[r] bf16 [T_r, H], weights[r] fp32 [T_r, k], w13[r] bf16 [E/R, 2I, H],
//   w2[r] bf16 [E/R, H, I], shared_w13 bf16 [2S, H] and shared_w2 [H, S] or
//   None: the forward's inputs, unchanged since;
//   preact, shared_preact, expert_rows, expert_offset, schedule_rows: the
//   training op's outputs after `out`, as it returned them. preact and
//   shared_preact both EMPTY LISTS (what the training op returns with
//   keep_preact=False) select recompute mode (mok::BackwardMode::kRecompute):
//   the kernel recomputes [gate | up] from the pulled x rows and x, no
//   pre-activation is read, and the gradients are save mode's bits. Else
//   each holds one tensor per rank (save mode); one empty and not the
//   other is refused;
//   dout[r] bf16 [T_r, H]: dL/dout of rank r's out;
//   tuning: the forward's tuning list (the backward is made with the same
//   FusedForwardOptions; it replaces ring_slots with its own);
//   main_w13 [E, 2I, H], main_w2 [E, H, I], main_shared_w13 [2S, H],
//   main_shared_w2 [H, S]: optional fp32 buffers the weight gradients are
//   added to (one fp32 addition per element and rank share) instead of being
//   returned.
// Returns (dx bf16 [T, H], dweights fp32 [T, k], dw13 fp32 [E, 2I, H], dw2
// fp32 [E, H, I], dshared_w13 fp32 [2S, H], dshared_w2 fp32 [H, S]), T the
// ranks' tokens in rank order (rank r's rows after those of ranks < r, global
// token order) and the experts in global order (rank r's at [r E/R,
// (r+1) E/R)); an output whose gradient went to a main buffer, and the shared
// ones without a shared expert, are empty fp32 tensors of shape [0]. Every
// output is one tensor, not a list per rank: torch.compile functionalizes an
// op that mutates its arguments (the main buffers) only if it returns no
// lists.
//
// The kernel's weight gradients are fp32 and overwrite or (accumulate) add to
// their buffers; one flag covers all four. When any main buffer is given the
// pass accumulates, and the outputs without one are allocated as zeros
// (0 + g = g: the same values, at the cost of clearing them).
//
// The shared expert's weight gradients come from the kernel as one share per
// rank (its own tokens' sum, as data parallelism makes them). They are added
// here in rank order, in fp32, on the stream: share 0 + share 1 + ..., or each
// added to the main buffer in turn, so the result is deterministic; at R = 1
// it is the one share itself. (At R > 1 this is not the bits of one sum over
// every token, which the staged backward computes.)
//
// The kernel takes each rank's pass state (FusedForward::pass_state_bytes()),
// the blob the forward kept its schedule in; the training op hands out its
// schedule as three int32 tensors instead, so the op puts them back into a
// blob of the library's layout (world::pass_state_layout, what
// FusedForward::pass_state_regions() reports) on the stream before the pass.
// The forward may have run with a larger capacity (MOK_TOKEN_BUCKET): its
// schedule rows past this call's capacity are never part of the schedule, and
// only the first saved_rows_for(this call's layer) rows are read.
//
// One FusedBackward per layer shape, device, tuning and mode (the forward op
// cache's key, with this call's token counts, and the BackwardMode: a save-mode
// and a recompute-mode object of one layer are two entries, their workspaces
// differ), made with the forward's options (it
// validates them as the forward did, then replaces ring_slots with its own),
// kept in a small LRU cache like the forward's. With token_capacity (the
// forward's), the object is made for the capacity and each pass gives its
// counts (BackwardRankTensors::tokens): counts that change from call to call
// share it. Without, each distinct set of counts makes its own object
// (MOK_TOKEN_BUCKET does not reach the backward). No host synchronisation unless
// check_errors (then it waits and raises if the pass aborted), as the forward.
// Kernels: CUDA, Meta (the same checks, outputs of the right shapes), CPU
// (refuses, with a message). Errors follow op_errors.hpp.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "forward_cache.hpp"
#include "forward_call.hpp"
#include "forward_tensors.hpp"
#include "lru_cache.hpp"
#include "mok/fused_backward.hpp"
#include "mok/fused_forward.hpp"
#include "mok/row_source.hpp"
#include "op_checks.hpp"
#include "op_errors.hpp"
#include "op_outputs.hpp"
#include "tuning_options.hpp"
#include "world/fused_kernel.hpp"
#include "world/workspace_layout.hpp"

namespace {

using mok::torch_ops::at_rank;
using mok::torch_ops::check_shape;
using mok::torch_ops::check_tensor;
using mok::torch_ops::checked_int;
using mok::torch_ops::expect;
using mok::torch_ops::num;
using mok::torch_ops::shape_of;
using mok::torch_ops::TensorSpec;
using mok::torch_ops::kActivations, mok::torch_ops::kExpertWeights, mok::torch_ops::kSharedWeights;

// The backward reads the routing weights one float at a time: any slice will do.
const TensorSpec kBackwardWeights{at::kFloat, 2, /*aligned=*/false};
const TensorSpec kSavedRows{at::kBFloat16, 2, /*aligned=*/true};
const TensorSpec kScheduleCounts{at::kInt, 1};
const TensorSpec kScheduleRows{at::kInt, 2};
const TensorSpec kMainGrad3{at::kFloat, 3, /*aligned=*/true};
const TensorSpec kMainGrad2{at::kFloat, 2, /*aligned=*/true};

static_assert(sizeof(mok::RowSource) == 3 * sizeof(int32_t), "a schedule row is (rank, token, slot) as int32");

// ---- the cache of FusedBackward objects -------------------------------------

// At most this many objects: each holds whole-schedule buffers (dout, x,
// [da | db] and w h rows of every schedule row, plus the combine rows), several
// times the forward's ring (about 2 GB for DeepSeek-V3's per-GPU share).
constexpr size_t kBackwardCacheCapacity = 4;

// The cache's key: the forward's, and the mode the object was made in.
struct BackwardKey {
  mok::torch_ops::ForwardKey forward;
  mok::BackwardMode mode = mok::BackwardMode::kSave;
  auto operator<=>(const BackwardKey&) const = default;
};

struct CachedBackward {
  std::mutex mutex;  // run() reuses the workspace and host-side state: one pass at a time
  std::unique_ptr<mok::FusedBackward> backward;
};

std::mutex cache_mutex;

mok::torch_ops::LruCache<BackwardKey, CachedBackward>& cache() {
  static mok::torch_ops::LruCache<BackwardKey, CachedBackward> objects(kBackwardCacheCapacity);
  return objects;
}

std::shared_ptr<CachedBackward> cached_backward(const BackwardKey& key, const mok::LayerConfig& config) {
  std::lock_guard<std::mutex> lock(cache_mutex);  // held while an object is made (it allocates)
  return cache().get_or_make(key, [&] {
    auto made = std::make_shared<CachedBackward>();
    made->backward =
        std::make_unique<mok::FusedBackward>(config, mok::torch_ops::forward_options(key.forward.tuning), key.mode);
    return made;
  });
}

std::vector<int64_t> backward_cache_info() {
  std::lock_guard<std::mutex> lock(cache_mutex);
  return {static_cast<int64_t>(cache().size()), static_cast<int64_t>(cache().capacity())};
}

// ---- argument checks --------------------------------------------------------

struct MainGrads {
  const std::optional<at::Tensor>& w13;
  const std::optional<at::Tensor>& w2;
  const std::optional<at::Tensor>& shared_w13;
  const std::optional<at::Tensor>& shared_w2;
};

bool given(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// The layer the arguments describe, once they are checked.
struct BackwardCall {
  mok::LayerConfig config;  // this call's token counts
  mok::LayerConfig object;  // the object's: config, or the token_capacity for every rank
  BackwardKey key;
  bool recompute = false;   // preact and shared_preact empty: BackwardMode::kRecompute
  at::Device device = at::kCPU;
  bool has_shared = false;
  bool accumulate = false;  // any main buffer given
  bool bf16 = false;        // the kernel writes the weight gradients rounded once to bf16 (bf16_output)
  int64_t capacity = 0;     // schedule rows the pass reads: FusedForward::saved_rows_for(config)
};

BackwardCall check_backward_arguments(at::TensorList x, at::TensorList weights, at::TensorList w13,
                                      at::TensorList w2, const std::optional<at::Tensor>& shared_w13,
                                      const std::optional<at::Tensor>& shared_w2, at::TensorList preact,
                                      at::TensorList shared_preact, at::TensorList expert_rows,
                                      at::TensorList expert_offset, at::TensorList schedule_rows,
                                      at::TensorList dout, at::IntArrayRef tuning, const MainGrads& main,
                                      int64_t token_capacity) {
  const int64_t R = static_cast<int64_t>(x.size());
  expect(R >= 1, "x must hold one tensor per rank (got an empty list)");
  // Recompute mode: no pre-activations at all (the training op's keep_preact=False).
  const bool recompute = preact.empty() && shared_preact.empty();
  expect(recompute || (!preact.empty() && !shared_preact.empty()),
         "preact and shared_preact must both be empty lists (recompute mode) or both hold one tensor per rank "
         "(save mode); got " + num(static_cast<int64_t>(preact.size())) + " and " +
             num(static_cast<int64_t>(shared_preact.size())) + " tensors");
  struct PerRank {
    at::TensorList list;
    const char* name;
    bool required;
  };
  const PerRank lists[] = {
      {weights, "weights", true}, {w13, "w13", true}, {w2, "w2", true}, {preact, "preact", !recompute},
      {shared_preact, "shared_preact", !recompute}, {expert_rows, "expert_rows", true},
      {expert_offset, "expert_offset", true}, {schedule_rows, "schedule_rows", true}, {dout, "dout", true}};
  for (const auto& [list, name, required] : lists) {
    if (!required) continue;
    expect(static_cast<int64_t>(list.size()) == R, std::string(name) + " must hold " + num(R) +
                                                        " tensors, one per rank, as x does (got " +
                                                        num(static_cast<int64_t>(list.size())) + ")");
  }

  BackwardCall call;
  call.recompute = recompute;
  call.device = x[0].device();
  mok::torch_ops::expect_cuda(call.device, "x[0]");
  check_tensor(x[0], "x[0]", kActivations, call.device);
  check_tensor(weights[0], "weights[0]", kBackwardWeights, call.device);
  check_tensor(w13[0], "w13[0]", kExpertWeights, call.device);
  check_tensor(w2[0], "w2[0]", kExpertWeights, call.device);
  const int64_t H = x[0].size(1), k = weights[0].size(1), I = w2[0].size(2), El = w13[0].size(0);

  mok::LayerConfig& config = call.config;
  config.hidden = checked_int(H, "H (x[0].size(1))");
  config.intermediate = checked_int(I, "I (w2[0].size(2))");
  config.num_experts = checked_int(El * R, "E (w13[0].size(0) times the world size)");
  config.top_k = checked_int(k, "k (weights[0].size(1))");
  config.world_size = checked_int(R, "the world size (len(x))");

  call.has_shared = given(shared_w13);
  expect(call.has_shared == given(shared_w2), "give both shared_w13 and shared_w2, or neither");
  int64_t S = 0;
  if (call.has_shared) {
    check_tensor(*shared_w13, "shared_w13", kSharedWeights, call.device);
    check_tensor(*shared_w2, "shared_w2", kSharedWeights, call.device);
    S = shared_w2->size(1);
    check_shape(*shared_w13, "shared_w13", {2 * S, H}, "[2S, H]");
    check_shape(*shared_w2, "shared_w2", {H, S}, "[H, S]");
    config.num_shared_experts = 1;
    config.shared_intermediate = checked_int(S, "S (shared_w2.size(1))");
  }
  for (int64_t r = 0; r < R; ++r) {
    const std::string at = at_rank(r);
    check_tensor(x[r], "x" + at, kActivations, call.device);
    check_tensor(weights[r], "weights" + at, kBackwardWeights, call.device);
    check_tensor(w13[r], "w13" + at, kExpertWeights, call.device);
    check_tensor(w2[r], "w2" + at, kExpertWeights, call.device);
    check_tensor(dout[r], "dout" + at, kActivations, call.device);
    const int64_t T = x[r].size(0);
    check_shape(x[r], "x" + at, {T, H}, "[T, H]");
    check_shape(weights[r], "weights" + at, {T, k}, "[T, k]");
    check_shape(w13[r], "w13" + at, {El, 2 * I, H}, "[E/R, 2I, H]");
    check_shape(w2[r], "w2" + at, {El, H, I}, "[E/R, H, I]");
    check_shape(dout[r], "dout" + at, {T, H}, "[T, H] (x" + at + "'s shape)");
    if (!recompute) {
      check_tensor(shared_preact[r], "shared_preact" + at, kSavedRows, call.device);
      check_shape(shared_preact[r], "shared_preact" + at, {T, 2 * S}, "[T, 2S] (S = 0 without a shared expert)");
    }
    config.tokens_per_rank.push_back(checked_int(T, "T (x" + at + ".size(0))"));
  }

  // What the forward kept: at least this call's capacity of schedule rows
  // (the forward's own may be larger: its token_capacity's, or rounded up to
  // MOK_TOKEN_BUCKET).
  call.capacity = mok::FusedForward::saved_rows_for(config);
  for (int64_t r = 0; r < R; ++r) {
    const std::string at = at_rank(r);
    if (!recompute) check_tensor(preact[r], "preact" + at, kSavedRows, call.device);
    check_tensor(expert_rows[r], "expert_rows" + at, kScheduleCounts, call.device);
    check_tensor(expert_offset[r], "expert_offset" + at, kScheduleCounts, call.device);
    check_tensor(schedule_rows[r], "schedule_rows" + at, kScheduleRows, call.device);
    check_shape(expert_rows[r], "expert_rows" + at, {El}, "[E/R]");
    check_shape(expert_offset[r], "expert_offset" + at, {El + 1}, "[E/R + 1]");
    if (!recompute) {
      expect(preact[r].size(1) == 2 * I && preact[r].size(0) >= call.capacity,
             "preact" + at + " must be [rows, 2I] with rows >= " + num(call.capacity) +
                 " (the training forward's saved rows for this layer; 2I = " + num(2 * I) + "), got " +
                 shape_of(preact[r]));
    }
    expect(schedule_rows[r].size(1) == 3 && schedule_rows[r].size(0) >= call.capacity,
           "schedule_rows" + at + " must be [rows, 3] with rows >= " + num(call.capacity) +
               " (the training forward's saved rows for this layer), got " + shape_of(schedule_rows[r]));
  }

  const auto check_main = [&](const std::optional<at::Tensor>& t, const char* name, const TensorSpec& spec,
                              const std::vector<int64_t>& sizes, const char* what) {
    if (!given(t)) return;
    check_tensor(*t, name, spec, call.device);
    check_shape(*t, name, sizes, what);
    call.accumulate = true;
  };
  check_main(main.w13, "main_w13", kMainGrad3, {El * R, 2 * I, H}, "[E, 2I, H]");
  check_main(main.w2, "main_w2", kMainGrad3, {El * R, H, I}, "[E, H, I]");
  expect(call.has_shared || (!given(main.shared_w13) && !given(main.shared_w2)),
         "main_shared_w13 and main_shared_w2 need a shared expert (shared_w13 and shared_w2 are None)");
  check_main(main.shared_w13, "main_shared_w13", kMainGrad2, {2 * S, H}, "[2S, H]");
  check_main(main.shared_w2, "main_shared_w2", kMainGrad2, {H, S}, "[H, S]");

  call.object = config;
  call.object.tokens_per_rank = mok::torch_ops::capacity_counts(config.tokens_per_rank, token_capacity);

  call.key.mode = recompute ? mok::BackwardMode::kRecompute : mok::BackwardMode::kSave;
  mok::torch_ops::ForwardKey& key = call.key.forward;
  key.tokens_per_rank = call.object.tokens_per_rank;
  key.hidden = config.hidden;
  key.intermediate = config.intermediate;
  key.num_experts = config.num_experts;
  key.top_k = config.top_k;
  key.shared_width = config.shared_width();
  key.device = call.device.is_cuda() ? call.device.index() : -1;
  key.tuning = mok::torch_ops::tuning_values(tuning);
  mok::torch_ops::forward_options(key.tuning);  // refuses values that do not fit an int, before launch
  return call;
}

// ---- outputs ------------------------------------------------------------------

// Whether the kernel itself writes the weight gradients as bf16 (each the
// fp32 sum rounded once: the bits the op's caller would get by rounding the
// fp32 output): asked for, and every output is the kernel's own -- no main
// buffer to add to, and no shared expert whose per-rank shares (R > 1) the op
// must sum in fp32 first.
bool bf16_output(const BackwardCall& call, bool asked) {
  return asked && !call.accumulate && (call.config.world_size == 1 || !call.has_shared);
}

using BackwardOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// A weight-gradient output of `sizes`: empty ([0]) where it goes to a main
// buffer or does not exist; else zeros when the kernel accumulates into it,
// uninitialised when the kernel overwrites it (or the op writes it whole).
// Outputs skip torch's deterministic fill: every element is written
// (op_outputs.hpp).
at::Tensor weight_grad_output(bool exists, const std::optional<at::Tensor>& main, at::IntArrayRef sizes,
                              const at::TensorOptions& options, bool zeros) {
  if (!exists || given(main)) return at::empty({0}, options);
  return zeros ? mok::torch_ops::zeros_output(sizes, options) : mok::torch_ops::written_output(sizes, options);
}

BackwardOutputs allocate(const BackwardCall& call, at::TensorList x, at::TensorList weights, const MainGrads& main) {
  const mok::LayerConfig& c = call.config;
  const int64_t H = c.hidden, I = c.intermediate, E = c.num_experts, S = c.shared_width();
  const at::TensorOptions f32 = x[0].options().dtype(at::kFloat);
  const int64_t T = c.total_tokens(), k = c.top_k;
  BackwardOutputs o;
  std::get<0>(o) = mok::torch_ops::written_output({T, H}, x[0].options());
  std::get<1>(o) = mok::torch_ops::written_output({T, k}, weights[0].options());
  // At R > 1 the shared expert's outputs are the sums of per-rank shares,
  // written by the op, not the kernel.
  const bool shared_zeros = call.accumulate && c.world_size == 1;
  const at::TensorOptions grads = call.bf16 ? f32.dtype(at::kBFloat16) : f32;
  std::get<2>(o) = weight_grad_output(true, main.w13, {E, 2 * I, H}, grads, call.accumulate);
  std::get<3>(o) = weight_grad_output(true, main.w2, {E, H, I}, grads, call.accumulate);
  std::get<4>(o) = weight_grad_output(call.has_shared, main.shared_w13, {2 * S, H}, grads, shared_zeros);
  std::get<5>(o) = weight_grad_output(call.has_shared, main.shared_w2, {H, S}, grads, shared_zeros);
  return o;
}

// ---- the op -------------------------------------------------------------------

// Rank r's pass state, rebuilt from the schedule tensors the training op handed
// out, in the layout the library reads (the copies run on the current stream).
at::Tensor pass_state(const BackwardCall& call, const mok::world::PassStateLayout& layout,
                      const at::Tensor& expert_rows, const at::Tensor& expert_offset,
                      const at::Tensor& schedule_rows) {
  at::Tensor state = at::empty({static_cast<int64_t>(layout.bytes)}, expert_rows.options().dtype(at::kByte));
  const auto ints = [&](const mok::world::Region& region, int64_t count) {
    return state.narrow(0, static_cast<int64_t>(region.offset), count * 4).view(at::kInt);
  };
  ints(layout.expert_rows, expert_rows.numel()).copy_(expert_rows);
  ints(layout.expert_offset, expert_offset.numel()).copy_(expert_offset);
  ints(layout.rows, call.capacity * 3).copy_(schedule_rows.narrow(0, 0, call.capacity).reshape({-1}));
  return state;
}

BackwardOutputs fused_backward_cuda(at::TensorList x, at::TensorList weights, at::TensorList w13, at::TensorList w2,
                                    const std::optional<at::Tensor>& shared_w13,
                                    const std::optional<at::Tensor>& shared_w2, at::TensorList preact,
                                    at::TensorList shared_preact, at::TensorList expert_rows,
                                    at::TensorList expert_offset, at::TensorList schedule_rows, at::TensorList dout,
                                    at::IntArrayRef tuning, const std::optional<at::Tensor>& main_w13,
                                    const std::optional<at::Tensor>& main_w2,
                                    const std::optional<at::Tensor>& main_shared_w13,
                                    const std::optional<at::Tensor>& main_shared_w2, bool check_errors,
                                    bool bf16_weight_grads, int64_t token_capacity) {
  const MainGrads main{main_w13, main_w2, main_shared_w13, main_shared_w2};
  BackwardCall call = check_backward_arguments(x, weights, w13, w2, shared_w13, shared_w2, preact, shared_preact,
                                               expert_rows, expert_offset, schedule_rows, dout, tuning, main,
                                               token_capacity);
  call.bf16 = bf16_output(call, bf16_weight_grads);
  const c10::cuda::CUDAGuard guard(call.device);
  BackwardOutputs o = allocate(call, x, weights, main);
  auto& [dx, dweights, dw13, dw2, dshared_w13, dshared_w2] = o;
  const mok::LayerConfig& c = call.config;
  const int64_t R = c.world_size, El = c.experts_per_rank(), H = c.hidden, I = c.intermediate,
                S = c.shared_width();

  // Where each rank's weight gradients go: its experts' slice of the routed
  // buffers; for the shared expert at R > 1, a share per rank, summed below.
  // (Bytes: the elements are fp32, or bf16 with call.bf16.)
  const int64_t element = call.bf16 ? 2 : 4;
  auto* routed13 = static_cast<uint8_t*>((given(main.w13) ? *main.w13 : dw13).data_ptr());
  auto* routed2 = static_cast<uint8_t*>((given(main.w2) ? *main.w2 : dw2).data_ptr());
  at::Tensor shares13, shares2;
  const at::TensorOptions f32 = x[0].options().dtype(at::kFloat);
  if (call.has_shared && R > 1) {
    shares13 = call.accumulate ? at::zeros({R, 2 * S, H}, f32) : at::empty({R, 2 * S, H}, f32);
    shares2 = call.accumulate ? at::zeros({R, H, S}, f32) : at::empty({R, H, S}, f32);
  }

  const mok::world::PassStateLayout layout = mok::torch_ops::raising_torch_errors(
      [&] { return mok::world::pass_state_layout(call.object, mok::world::fused_kernel_facts()); });
  std::vector<at::Tensor> states;
  std::vector<mok::BackwardRankTensors> tensors;
  // Rank r's rows of dx (16-byte aligned: H is a multiple of 64) and of
  // dweights (written one float at a time: any slice will do).
  int64_t first = 0;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t T = c.tokens_per_rank[static_cast<size_t>(r)];
    at::Tensor dweights_rows = dweights.narrow(0, first, T);
    states.push_back(pass_state(call, layout, expert_rows[r], expert_offset[r], schedule_rows[r]));
    mok::BackwardRankTensors t;
    t.x = x[r].data_ptr();
    t.weights = weights[r].data_ptr<float>();
    t.w13 = w13[r].data_ptr();
    t.w2 = w2[r].data_ptr();
    t.shared_w13 = call.has_shared ? shared_w13->data_ptr() : nullptr;
    t.shared_w2 = call.has_shared ? shared_w2->data_ptr() : nullptr;
    t.pass_state = states.back().data_ptr();
    // Recompute mode: null (the kernel keeps its own [gate | up]).
    t.preact = call.recompute ? nullptr : preact[r].data_ptr();
    t.shared_preact = call.has_shared && !call.recompute ? shared_preact[r].data_ptr() : nullptr;
    t.dout = dout[r].data_ptr();
    t.dx = dx.narrow(0, first, T).data_ptr();
    t.dweights = dweights_rows.data_ptr<float>();
    t.dw13 = routed13 + r * El * 2 * I * H * element;
    t.dw2 = routed2 + r * El * H * I * element;
    t.tokens = static_cast<int>(T);  // the object's count, or fewer under a capacity
    if (call.has_shared) {
      t.dshared_w13 = R > 1 ? shares13[r].data_ptr()
                            : (given(main.shared_w13) ? *main.shared_w13 : dshared_w13).data_ptr();
      t.dshared_w2 = R > 1 ? shares2[r].data_ptr()
                           : (given(main.shared_w2) ? *main.shared_w2 : dshared_w2).data_ptr();
    }
    tensors.push_back(t);
    first += T;
  }
  mok::torch_ops::raising_torch_errors([&] {
    auto cached = cached_backward(call.key, call.object);
    auto stream = c10::cuda::getCurrentCUDAStream(call.device.index()).stream();
    const std::lock_guard<std::mutex> lock(cached->mutex);
    cached->backward->run(tensors, stream,
                          call.accumulate ? mok::WeightGradOutput::kAccumulateFp32
                          : call.bf16     ? mok::WeightGradOutput::kBf16
                                          : mok::WeightGradOutput::kFp32);
    if (check_errors) cached->backward->check(stream);
  });

  // The ranks' shares of the shared expert's gradients, in rank order.
  if (call.has_shared && R > 1) {
    const auto sum = [R](const at::Tensor& shares, const std::optional<at::Tensor>& into, at::Tensor& out) {
      if (given(into)) {
        for (int64_t r = 0; r < R; ++r) into->add_(shares[r]);
        return;
      }
      at::add_out(out, shares[0], shares[1]);
      for (int64_t r = 2; r < R; ++r) out.add_(shares[r]);
    };
    sum(shares13, main.shared_w13, dshared_w13);
    sum(shares2, main.shared_w2, dshared_w2);
  }
  return o;
}

// Fake tensors: the same checks, outputs of the right shape, no work.
BackwardOutputs fused_backward_meta(at::TensorList x, at::TensorList weights, at::TensorList w13, at::TensorList w2,
                                    const std::optional<at::Tensor>& shared_w13,
                                    const std::optional<at::Tensor>& shared_w2, at::TensorList preact,
                                    at::TensorList shared_preact, at::TensorList expert_rows,
                                    at::TensorList expert_offset, at::TensorList schedule_rows, at::TensorList dout,
                                    at::IntArrayRef tuning, const std::optional<at::Tensor>& main_w13,
                                    const std::optional<at::Tensor>& main_w2,
                                    const std::optional<at::Tensor>& main_shared_w13,
                                    const std::optional<at::Tensor>& main_shared_w2, bool /*check_errors*/,
                                    bool bf16_weight_grads, int64_t token_capacity) {
  const MainGrads main{main_w13, main_w2, main_shared_w13, main_shared_w2};
  BackwardCall call = check_backward_arguments(x, weights, w13, w2, shared_w13, shared_w2, preact, shared_preact,
                                               expert_rows, expert_offset, schedule_rows, dout, tuning, main,
                                               token_capacity);
  call.bf16 = bf16_output(call, bf16_weight_grads);
  return allocate(call, x, weights, main);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mok, m) {
  m.def(
      "fused_backward(Tensor[] x, Tensor[] weights, Tensor[] w13, Tensor[] w2, Tensor? shared_w13, "
      "Tensor? shared_w2, Tensor[] preact, Tensor[] shared_preact, Tensor[] expert_rows, Tensor[] expert_offset, "
      "Tensor[] schedule_rows, Tensor[] dout, int[] tuning, Tensor(a!)? main_w13=None, Tensor(b!)? main_w2=None, "
      "Tensor(c!)? main_shared_w13=None, Tensor(d!)? main_shared_w2=None, bool check_errors=False, "
      "bool bf16_weight_grads=False, int token_capacity=0) -> "
      "(Tensor dx, Tensor dweights, Tensor dw13, Tensor dw2, Tensor dshared_w13, Tensor dshared_w2)");
  m.def("backward_cache_info() -> int[]", &backward_cache_info);
}

TORCH_LIBRARY_IMPL(mok, CUDA, m) { m.impl("fused_backward", &fused_backward_cuda); }
TORCH_LIBRARY_IMPL(mok, Meta, m) { m.impl("fused_backward", &fused_backward_meta); }
// CPU tensors reach the same checks, which refuse them by name.
TORCH_LIBRARY_IMPL(mok, CPU, m) { m.impl("fused_backward", &fused_backward_cuda); }
