// The fused backward (mok::FusedBackward, virtual and peer worlds) against the CPU
// reference backward, and the determinism docs/backward-design.md promises:
// dx, dweights, dW13 and dW2 the same bits at every world size, and every
// output the same bits over repeated passes and any minibatch, lookahead or SM
// split, and in either mode (save and recompute); weight gradients added once
// to the caller's buffers when accumulating.
//
// Each test runs the forward's training pass first (pass state and, in save
// mode, gate/up pre-activations kept in caller-owned buffers, poisoned
// beforehand so that padding rows hold NaN), then the backward with every
// output poisoned: an element the backward leaves unwritten stays NaN and
// fails the comparison.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/cuda_check.hpp"
#include "gpu_test_env.hpp"
#include "mok/bf16.hpp"
#include "mok/device_layer.hpp"
#include "mok/error.hpp"
#include "mok/fused_backward.hpp"
#include "mok/fused_forward.hpp"
#include "mok/presets.hpp"
#include "mok/reference.hpp"
#include "mok/schedule.hpp"
#include "mok/synthetic.hpp"
#include "protocol/pass_backward.hpp"

namespace {

using mok::synthetic::RoutingMode;

// Relative L2 error bound against the reference, for every gradient: the one
// test_backward_composition.cpp uses for the staged backward, whose arithmetic
// per element the fused kernel repeats (bf16 pre-activations, d13 and w h
// rounded once to bf16, fp32 accumulation, dx rounded once to bf16).
constexpr double kTolerance = 2e-2;

// Makes `device` current for a scope (-1: leaves the current GPU alone).
class OnDevice {
 public:
  explicit OnDevice(int device) {
    MOK_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device >= 0) MOK_CUDA_CHECK(cudaSetDevice(device));
  }
  ~OnDevice() { cudaSetDevice(previous_); }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int previous_ = 0;
};

// A device allocation on `device` (-1: the current GPU), freed on scope exit.
// Zero bytes give a null pointer, as DeviceLayer gives a rank without tokens.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t bytes, int device = -1) : bytes_(bytes), device_(device) {
    OnDevice on(device_);
    if (bytes_ > 0) MOK_CUDA_CHECK(cudaMalloc(&ptr_, bytes_));
  }
  DeviceBytes(DeviceBytes&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)), device_(other.device_) {}
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  DeviceBytes& operator=(DeviceBytes&&) = delete;
  ~DeviceBytes() {
    if (ptr_ == nullptr) return;
    OnDevice on(device_);
    cudaFree(ptr_);
  }

  void* get() const { return ptr_; }
  float* floats() const { return static_cast<float*>(ptr_); }
  // 0xFF bytes: a NaN in bf16 and in fp32.
  void poison() const {
    OnDevice on(device_);
    if (bytes_ > 0) MOK_CUDA_CHECK(cudaMemset(ptr_, 0xFF, bytes_));
  }
  void upload(const void* host) const {
    OnDevice on(device_);
    if (bytes_ > 0) MOK_CUDA_CHECK(cudaMemcpy(ptr_, host, bytes_, cudaMemcpyHostToDevice));
  }
  template <typename T>
  std::vector<T> download() const {
    OnDevice on(device_);
    std::vector<T> host(bytes_ / sizeof(T));
    if (bytes_ > 0) MOK_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, bytes_, cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  int device_ = -1;
};

// A test layer: a preset-like shape over an uneven world.
mok::LayerConfig layer_config(int hidden, int intermediate, int experts, int top_k, int shared_experts,
                              std::vector<int> tokens_per_rank) {
  const mok::LayerShape shape{"fused-backward-test", hidden, intermediate, experts, top_k, shared_experts, "test"};
  return mok::make_config(shape, std::move(tokens_per_rank));
}

// The backward's inputs that no forward makes: the layer (host and device)
// and a random dout.
struct Problem {
  mok::synthetic::Layer layer;
  std::vector<std::vector<float>> dout;  // [R] of [T_r, H]
  std::unique_ptr<mok::DeviceLayer> device;
  std::vector<DeviceBytes> dout_bf16;  // [R]
  std::vector<int> devices;            // each rank's GPU (a peer world), or empty: the current GPU

  const mok::LayerConfig& config() const { return layer.config; }
  int device_of(int r) const { return devices.empty() ? -1 : devices[static_cast<size_t>(r)]; }
};

// `devices`: each rank's tensors on its GPU, for a peer world; empty: every
// rank's on the current GPU.
Problem make_problem(const mok::LayerConfig& config, RoutingMode mode, uint64_t seed,
                     const std::vector<int>& devices = {}) {
  Problem p;
  p.layer = mok::synthetic::make_layer(config, seed, mode);
  p.dout = mok::synthetic::random_dout(config, seed + 1);
  p.device = std::make_unique<mok::DeviceLayer>(p.layer, devices);
  p.devices = devices;
  for (size_t r = 0; r < p.dout.size(); ++r) {
    const std::vector<float>& rank = p.dout[r];
    std::vector<uint16_t> bits(rank.size());
    for (size_t i = 0; i < rank.size(); ++i) bits[i] = mok::float_to_bf16_bits(rank[i]);
    p.dout_bf16.emplace_back(bits.size() * 2, p.device_of(static_cast<int>(r))).upload(bits.data());
  }
  return p;
}

// What the forward's training pass keeps for the backward, per rank.
struct SavedPass {
  std::vector<DeviceBytes> pass_state, preact, shared_preact;  // [R]
};

// One training forward pass with its own object, destroyed before the
// backward runs: the backward must need nothing of the forward's but what the
// caller kept. The kept buffers are poisoned first, so the padding rows of
// preact (never written) hold NaN that no gradient may pick up. For a
// recompute-mode backward (`mode`) the pass keeps its schedule (pass state)
// only: preact and shared_preact are empty, null in backward_tensors.
SavedPass run_training_forward(const Problem& p, const mok::FusedForwardOptions& options,
                               mok::BackwardMode mode = mok::BackwardMode::kSave) {
  const mok::LayerConfig& c = p.config();
  mok::FusedForward forward(c, options);
  SavedPass saved;
  std::vector<mok::RankTensors> tensors = p.device->tensors();
  const bool keep_preact = mode == mok::BackwardMode::kSave;
  for (int r = 0; r < c.world_size; ++r) {
    const size_t T = static_cast<size_t>(c.tokens_per_rank[static_cast<size_t>(r)]);
    const int gpu = p.device_of(r);
    saved.pass_state.emplace_back(forward.pass_state_bytes(), gpu).poison();
    saved.preact
        .emplace_back(keep_preact ? static_cast<size_t>(forward.saved_rows()) * 2 * c.intermediate * 2 : 0, gpu)
        .poison();
    saved.shared_preact.emplace_back(keep_preact ? T * 2 * c.shared_width() * 2 : 0, gpu).poison();
    mok::RankTensors& t = tensors[static_cast<size_t>(r)];
    t.pass_state = saved.pass_state.back().get();
    t.preact = saved.preact.back().get();
    t.shared_preact = saved.shared_preact.back().get();
  }
  p.device->poison_outputs();
  if (options.process_rank >= 0) {
    forward.run(tensors[0]);  // a process world runs its own rank's tensors
  } else {
    forward.run(tensors);
  }
  forward.check();
  return saved;
}

// The backward's outputs as the host sees them.
struct Grads {
  std::vector<uint16_t> dx;                                 // every rank's [T_r, H] bf16, in rank order
  std::vector<float> dweights;                              // every rank's [T_r, k]
  std::vector<float> dw13, dw2;                             // every rank's experts: [E, 2I, H], [E, H, I]
  std::vector<std::vector<float>> dshared_w13, dshared_w2;  // [R]: each rank's share
};

// Every rank's output buffers.
struct Outputs {
  std::vector<DeviceBytes> dx, dweights, dw13, dw2, dshared_w13, dshared_w2;  // [R]

  // `devices`: each rank's GPU (a peer world), or empty: the current GPU.
  explicit Outputs(const mok::LayerConfig& c, const std::vector<int>& devices = {}) {
    const size_t H = c.hidden, I = c.intermediate, S = c.shared_width(), El = c.experts_per_rank();
    for (int r = 0; r < c.world_size; ++r) {
      const size_t T = static_cast<size_t>(c.tokens_per_rank[static_cast<size_t>(r)]);
      const int gpu = devices.empty() ? -1 : devices[static_cast<size_t>(r)];
      dx.emplace_back(T * H * 2, gpu);
      dweights.emplace_back(T * c.top_k * 4, gpu);
      dw13.emplace_back(El * 2 * I * H * 4, gpu);
      dw2.emplace_back(El * H * I * 4, gpu);
      dshared_w13.emplace_back(2 * S * H * 4, gpu);
      dshared_w2.emplace_back(H * S * 4, gpu);
    }
  }

  void poison() const {
    for (const auto* buffers : {&dx, &dweights, &dw13, &dw2, &dshared_w13, &dshared_w2}) {
      for (const DeviceBytes& b : *buffers) b.poison();
    }
  }

  // The weight-gradient buffers set to `g`'s (before an accumulating pass).
  void upload_weight_grads(const Grads& g) const {
    const size_t ranks = dx.size(), per_rank13 = g.dw13.size() / ranks, per_rank2 = g.dw2.size() / ranks;
    for (size_t r = 0; r < ranks; ++r) {
      dw13[r].upload(g.dw13.data() + r * per_rank13);
      dw2[r].upload(g.dw2.data() + r * per_rank2);
      dshared_w13[r].upload(g.dshared_w13[r].data());
      dshared_w2[r].upload(g.dshared_w2[r].data());
    }
  }

  Grads download() const {
    Grads g;
    for (size_t r = 0; r < dx.size(); ++r) {
      const auto append = [](auto& all, const auto& part) { all.insert(all.end(), part.begin(), part.end()); };
      append(g.dx, dx[r].download<uint16_t>());
      append(g.dweights, dweights[r].download<float>());
      append(g.dw13, dw13[r].download<float>());
      append(g.dw2, dw2[r].download<float>());
      g.dshared_w13.push_back(dshared_w13[r].download<float>());
      g.dshared_w2.push_back(dshared_w2[r].download<float>());
    }
    return g;
  }
};

std::vector<mok::BackwardRankTensors> backward_tensors(const Problem& p, const SavedPass& saved,
                                                       const Outputs& out) {
  std::vector<mok::BackwardRankTensors> ranks;
  for (size_t r = 0; r < p.device->tensors().size(); ++r) {
    const mok::RankTensors& f = p.device->tensors()[r];
    mok::BackwardRankTensors b;
    b.x = f.x;
    b.weights = f.weights;
    b.w13 = f.w13;
    b.w2 = f.w2;
    b.shared_w13 = f.shared_w13;
    b.shared_w2 = f.shared_w2;
    b.pass_state = saved.pass_state[r].get();
    b.preact = saved.preact[r].get();
    b.shared_preact = saved.shared_preact[r].get();
    b.dout = p.dout_bf16[r].get();
    b.dx = out.dx[r].get();
    b.dweights = out.dweights[r].floats();
    b.dw13 = out.dw13[r].floats();
    b.dw2 = out.dw2[r].floats();
    b.dshared_w13 = out.dshared_w13[r].floats();
    b.dshared_w2 = out.dshared_w2[r].floats();
    ranks.push_back(b);
  }
  return ranks;
}

// One backward pass into `out` as it stands (the caller poisons it, or sets
// the base to accumulate onto).
Grads run_backward(mok::FusedBackward& backward, const Problem& p, const SavedPass& saved, const Outputs& out,
                   bool accumulate = false) {
  backward.run(backward_tensors(p, saved, out), nullptr, accumulate);
  backward.check();
  return out.download();
}

// The whole sequence with one set of options for both objects: training
// forward (keeping what `mode` reads), poisoned outputs, backward.
Grads forward_then_backward(const Problem& p, const mok::FusedForwardOptions& options,
                            mok::BackwardMode mode = mok::BackwardMode::kSave) {
  const SavedPass saved = run_training_forward(p, options, mode);
  mok::FusedBackward backward(p.config(), options, mode);
  const Outputs out(p.config(), p.devices);
  out.poison();
  return run_backward(backward, p, saved, out);
}

double value(uint16_t bf16) { return mok::bf16_bits_to_float(bf16); }
double value(float v) { return v; }

template <typename T>
std::vector<double> as_double(const std::vector<T>& v) {
  std::vector<double> d(v.size());
  for (size_t i = 0; i < v.size(); ++i) d[i] = value(v[i]);
  return d;
}

std::vector<double> flatten(const std::vector<std::vector<double>>& v) {
  std::vector<double> out;
  for (const auto& part : v) out.insert(out.end(), part.begin(), part.end());
  return out;
}

// The ranks' shares of a shared-expert gradient, summed (what a data-parallel
// all-reduce would make of them).
std::vector<double> sum_of_shares(const std::vector<std::vector<float>>& shares) {
  std::vector<double> sum(shares.empty() ? 0 : shares[0].size(), 0.0);
  for (const auto& share : shares) {
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += share[i];
  }
  return sum;
}

// ||got - want|| / ||want||: NaN when got holds a NaN (an unwritten, poisoned
// element), which fails every bound.
void expect_close(const std::vector<double>& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double num = 0, den = 0;
  size_t non_finite = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    non_finite += std::isfinite(got[i]) ? 0 : 1;
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  const double error = std::sqrt(num / std::max(den, 1e-300));
  EXPECT_EQ(non_finite, 0u) << what << ": elements not finite (unwritten outputs are NaN)";
  EXPECT_LT(error, kTolerance) << what << ": relative L2 error";
}

void expect_matches_reference(const Problem& p, const Grads& got) {
  const auto schedule = mok::build_schedule(p.config(), p.layer.routing(), {128, 1});
  mok::ReferenceOptions options;
  options.num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const auto ref =
      mok::reference_backward(p.layer.inputs(), schedule, mok::synthetic::rank_pointers(p.dout), options);
  expect_close(as_double(got.dx), flatten(ref.dx), "dx");
  expect_close(as_double(got.dweights), flatten(ref.dweights), "dweights");
  expect_close(as_double(got.dw13), ref.dw13, "dW13");
  expect_close(as_double(got.dw2), ref.dw2, "dW2");
  if (p.config().shared_width() > 0) {
    expect_close(sum_of_shares(got.dshared_w13), ref.dshared_w13, "shared dW13 (sum of the ranks' shares)");
    expect_close(sum_of_shares(got.dshared_w2), ref.dshared_w2, "shared dW2 (sum of the ranks' shares)");
  }
}

// Bitwise equality (NaN bits included, -0 != +0), naming the first difference.
template <typename T>
testing::AssertionResult same_bits(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) {
    return testing::AssertionFailure() << got.size() << " elements, want " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      return testing::AssertionFailure() << "element " << i << ": " << value(got[i]) << ", want " << value(want[i]);
    }
  }
  return testing::AssertionSuccess();
}

// dx, dweights, dW13 and dW2: the outputs whose bits do not depend on R.
void expect_same_routed_bits(const Grads& got, const Grads& want) {
  EXPECT_TRUE(same_bits(got.dx, want.dx)) << "dx";
  EXPECT_TRUE(same_bits(got.dweights, want.dweights)) << "dweights";
  EXPECT_TRUE(same_bits(got.dw13, want.dw13)) << "dW13";
  EXPECT_TRUE(same_bits(got.dw2, want.dw2)) << "dW2";
}

// Every output, the shared expert's per-rank shares included (same R).
void expect_same_bits(const Grads& got, const Grads& want) {
  expect_same_routed_bits(got, want);
  ASSERT_EQ(got.dshared_w13.size(), want.dshared_w13.size());
  for (size_t r = 0; r < want.dshared_w13.size(); ++r) {
    EXPECT_TRUE(same_bits(got.dshared_w13[r], want.dshared_w13[r])) << "shared dW13, rank " << r;
    EXPECT_TRUE(same_bits(got.dshared_w2[r], want.dshared_w2[r])) << "shared dW2, rank " << r;
  }
}

// Random fp32 values of `like`'s own scale (its RMS), so that adding the two
// rounds in most elements.
std::vector<float> random_like(const std::vector<float>& like, mok::synthetic::Rng& rng) {
  double sum = 0;
  for (float v : like) sum += static_cast<double>(v) * v;
  const double scale = like.empty() ? 1.0 : std::max(std::sqrt(sum / static_cast<double>(like.size())), 1e-3);
  std::vector<float> out(like.size());
  for (float& v : out) v = static_cast<float>(rng.uniform(-scale, scale));
  return out;
}

// a + b in fp32, element by element: what one addition per element gives.
std::vector<float> add(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> sum(a.size());
  for (size_t i = 0; i < a.size(); ++i) sum[i] = a[i] + b[i];
  return sum;
}

TEST(FusedBackward, MatchesTheReferenceBackwardForEveryWorldSize) {
  MOK_REQUIRE_HOPPER();
  // One global batch of 800 tokens, split unevenly (rank 1 of R = 4 has
  // none). Synthetic data is drawn in global token order, so every R sees the
  // same problem and must give the same routed bits.
  const std::vector<std::vector<int>> splits = {
      {800}, {370, 430}, {300, 0, 260, 240}, {100, 130, 60, 150, 120, 40, 110, 90}};
  struct Shape { const char* what; int hidden, intermediate, experts, top_k, shared; };
  for (const Shape& s : {Shape{"H 512, I 320, E 16, k 4, shared", 512, 320, 16, 4, 1},
                         Shape{"H 256, I 192, E 8, k 3, no shared", 256, 192, 8, 3, 0}}) {
    SCOPED_TRACE(s.what);
    std::vector<Grads> by_world;
    for (const std::vector<int>& tokens : splits) {
      SCOPED_TRACE("R = " + std::to_string(tokens.size()));
      const auto config = layer_config(s.hidden, s.intermediate, s.experts, s.top_k, s.shared, tokens);
      const Problem p = make_problem(config, RoutingMode::kSkewed, 41);
      by_world.push_back(forward_then_backward(p, {}));
      expect_matches_reference(p, by_world.back());
    }
    for (size_t i = 1; i < by_world.size(); ++i) {
      SCOPED_TRACE("bits of R = " + std::to_string(splits[i].size()) + " against R = 1");
      expect_same_routed_bits(by_world[i], by_world[0]);
    }
  }
}

TEST(FusedBackward, IsBitwiseRepeatableAndInvariantToMinibatchRingAndSmSplit) {
  MOK_REQUIRE_HOPPER();
  const auto config = layer_config(512, 320, 16, 4, 1, {260, 190});
  const Problem p = make_problem(config, RoutingMode::kSkewed, 43);

  // Five passes of one object on one saved forward pass.
  const SavedPass saved = run_training_forward(p, {});
  mok::FusedBackward backward(config);
  const Outputs out(config);
  out.poison();
  const Grads baseline = run_backward(backward, p, saved, out);
  expect_matches_reference(p, baseline);  // all written: poisoned NaN bits would compare equal below
  for (int run = 1; run < 5; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    out.poison();
    expect_same_bits(run_backward(backward, p, saved, out), baseline);
  }

  // Other options, for the forward and the backward alike.
  struct Split { int minibatch_rows, lookahead, ctas_per_rank, comm_ctas_per_rank; };
  for (const Split& s : {Split{128, 1, 0, 1}, Split{512, 3, 40, 3}, Split{128, 3, 40, 1}, Split{512, 1, 0, 3}}) {
    SCOPED_TRACE(testing::Message() << "minibatch_rows " << s.minibatch_rows << ", lookahead " << s.lookahead
                                    << ", ctas_per_rank " << s.ctas_per_rank << ", comm_ctas_per_rank "
                                    << s.comm_ctas_per_rank);
    mok::FusedForwardOptions options;
    options.minibatch_rows = s.minibatch_rows;
    options.lookahead = s.lookahead;
    options.ctas_per_rank = s.ctas_per_rank;
    options.comm_ctas_per_rank = s.comm_ctas_per_rank;
    expect_same_bits(forward_then_backward(p, options), baseline);
  }
}

// A traced pass computes the same bits, and its timeline holds every GEMM
// kind of the backward, every dispatched m-tile and the combine.
TEST(FusedBackward, TracingRecordsEveryKindAndKeepsTheBits) {
  MOK_REQUIRE_HOPPER();
  const auto config = layer_config(512, 320, 16, 4, 1, {260, 190});
  const Problem p = make_problem(config, RoutingMode::kUniform, 47);
  const SavedPass saved = run_training_forward(p, {});
  mok::FusedBackward plain(config);
  const Outputs out(config);
  out.poison();
  const Grads baseline = run_backward(plain, p, saved, out);
  expect_matches_reference(p, baseline);
  mok::FusedForwardOptions options;
  options.trace_events = 1 << 16;
  mok::FusedBackward traced(config, options);
  out.poison();
  expect_same_bits(run_backward(traced, p, saved, out), baseline);
  const std::vector<mok::TraceEvent> events = traced.trace();
  std::vector<int> mainloops(mok::protocol::BackwardPass::kNumKinds, 0);
  int copies = 0, combines = 0;
  for (const mok::TraceEvent& e : events) {
    EXPECT_LE(e.begin_ns, e.end_ns);
    const auto kind = static_cast<mok::TraceKind>(e.kind);
    if (kind == mok::TraceKind::kMainloop) {
      ASSERT_GE(e.detail, 0);
      ASSERT_LT(e.detail, mok::protocol::BackwardPass::kNumKinds);
      ++mainloops[static_cast<size_t>(e.detail)];
    }
    copies += kind == mok::TraceKind::kDispatchCopy;
    combines += kind == mok::TraceKind::kCombine;
  }
  for (int kind = 0; kind < mok::protocol::BackwardPass::kNumKinds; ++kind) {
    EXPECT_GT(mainloops[static_cast<size_t>(kind)], 0) << "no mainloop of backward kind " << kind;
  }
  EXPECT_GT(copies, 0);
  EXPECT_GT(combines, 0);
  // Off: trace() says so.
  EXPECT_THROW(plain.trace(), mok::Error);
}

TEST(FusedBackward, AccumulatesWeightGradientsIntoTheCallersBuffers) {
  MOK_REQUIRE_HOPPER();
  const auto config = layer_config(384, 192, 8, 2, 1, {230, 170});
  const Problem p = make_problem(config, RoutingMode::kUniform, 47);
  const SavedPass saved = run_training_forward(p, {});
  mok::FusedBackward backward(config);
  const Outputs out(config);
  out.poison();
  const Grads g = run_backward(backward, p, saved, out);
  expect_matches_reference(p, g);  // every element written and finite: NaN + anything would hide a wrong sum

  // A random base B in the weight-gradient buffers; dx and dweights poisoned.
  mok::synthetic::Rng rng(47, 3);
  Grads base = g;
  base.dw13 = random_like(g.dw13, rng);
  base.dw2 = random_like(g.dw2, rng);
  for (size_t r = 0; r < base.dshared_w13.size(); ++r) {
    base.dshared_w13[r] = random_like(g.dshared_w13[r], rng);
    base.dshared_w2[r] = random_like(g.dshared_w2[r], rng);
  }
  out.poison();
  out.upload_weight_grads(base);
  const Grads sum = run_backward(backward, p, saved, out, /*accumulate=*/true);

  EXPECT_TRUE(same_bits(sum.dx, g.dx)) << "dx";
  EXPECT_TRUE(same_bits(sum.dweights, g.dweights)) << "dweights";
  EXPECT_TRUE(same_bits(sum.dw13, add(base.dw13, g.dw13))) << "dW13 = B + G";
  EXPECT_TRUE(same_bits(sum.dw2, add(base.dw2, g.dw2))) << "dW2 = B + G";
  for (size_t r = 0; r < base.dshared_w13.size(); ++r) {
    EXPECT_TRUE(same_bits(sum.dshared_w13[r], add(base.dshared_w13[r], g.dshared_w13[r])))
        << "shared dW13 = B + G, rank " << r;
    EXPECT_TRUE(same_bits(sum.dshared_w2[r], add(base.dshared_w2[r], g.dshared_w2[r])))
        << "shared dW2 = B + G, rank " << r;
  }
}

// WeightGradOutput::kBf16: every weight gradient is its fp32 sum rounded
// once to bf16 (what autograd returns for bf16 weights); dx and dweights
// keep their bits. The routed experts' bf16 tiles are stored by TMA from the
// stage their K loop ended on, which the CTA's next tile hands back; with few
// CTAs per rank each stores many tiles in a row, and experts without rows
// (K = 0: zeros, no stage held) come between others.
void expect_bf16_weight_gradients_are_rounded_fp32(const mok::LayerConfig& config, RoutingMode mode,
                                                   const mok::FusedForwardOptions& options) {
  const Problem p = make_problem(config, mode, 53);
  const SavedPass saved = run_training_forward(p, options);
  mok::FusedBackward backward(config, options);
  const Outputs out(config);
  out.poison();
  const Grads g = run_backward(backward, p, saved, out);
  expect_matches_reference(p, g);

  out.poison();
  backward.run(backward_tensors(p, saved, out), nullptr, mok::WeightGradOutput::kBf16);
  backward.check();
  const auto rounded = [](const std::vector<float>& v) {
    std::vector<uint16_t> bits(v.size());
    for (size_t i = 0; i < v.size(); ++i) bits[i] = mok::float_to_bf16_bits(v[i]);
    return bits;
  };
  // The bf16 gradients fill the first half of each (fp32-sized) buffer.
  const auto first_half = [](const DeviceBytes& b, size_t count) {
    std::vector<uint16_t> all = b.download<uint16_t>();
    all.resize(count);
    return all;
  };
  const Grads again = out.download();
  EXPECT_TRUE(same_bits(again.dx, g.dx)) << "dx";
  EXPECT_TRUE(same_bits(again.dweights, g.dweights)) << "dweights";
  const size_t ranks = out.dx.size(), per13 = g.dw13.size() / ranks, per2 = g.dw2.size() / ranks;
  for (size_t r = 0; r < ranks; ++r) {
    const std::vector<float> g13(g.dw13.begin() + static_cast<std::ptrdiff_t>(r * per13),
                                 g.dw13.begin() + static_cast<std::ptrdiff_t>((r + 1) * per13));
    const std::vector<float> g2(g.dw2.begin() + static_cast<std::ptrdiff_t>(r * per2),
                                g.dw2.begin() + static_cast<std::ptrdiff_t>((r + 1) * per2));
    EXPECT_TRUE(same_bits(first_half(out.dw13[r], per13), rounded(g13))) << "dW13, rank " << r;
    EXPECT_TRUE(same_bits(first_half(out.dw2[r], per2), rounded(g2))) << "dW2, rank " << r;
    if (config.shared_width() == 0) continue;
    EXPECT_TRUE(same_bits(first_half(out.dshared_w13[r], g.dshared_w13[r].size()), rounded(g.dshared_w13[r])))
        << "shared dW13, rank " << r;
    EXPECT_TRUE(same_bits(first_half(out.dshared_w2[r], g.dshared_w2[r].size()), rounded(g.dshared_w2[r])))
        << "shared dW2, rank " << r;
  }
}

TEST(FusedBackward, Bf16WeightGradientsAreTheFp32SumsRoundedOnce) {
  MOK_REQUIRE_HOPPER();
  {
    SCOPED_TRACE("default options");
    expect_bf16_weight_gradients_are_rounded_fp32(layer_config(384, 192, 8, 2, 1, {230, 170}),
                                                  RoutingMode::kUniform, {});
  }
  mok::FusedForwardOptions few;  // 6 GEMM CTAs per rank: dozens of weight-gradient tiles each
  few.ctas_per_rank = 8;
  few.comm_ctas_per_rank = 2;
  {
    SCOPED_TRACE("8 CTAs per rank");
    expect_bf16_weight_gradients_are_rounded_fp32(layer_config(384, 192, 8, 2, 1, {230, 170}),
                                                  RoutingMode::kUniform, few);
  }
  {
    SCOPED_TRACE("8 CTAs per rank, every row on experts 0..2: the others have none");
    expect_bf16_weight_gradients_are_rounded_fp32(layer_config(256, 128, 8, 3, 0, {300, 170}),
                                                  RoutingMode::kSameExperts, few);
  }
}

// A layer and a routing, as the tests below list them.
struct LayerCase {
  const char* what;
  int hidden, intermediate, experts, top_k, shared;
  RoutingMode mode;
  std::vector<int> tokens;
};

TEST(FusedBackward, EdgeRoutings) {
  MOK_REQUIRE_HOPPER();
  const std::vector<LayerCase> cases = {
      {"top-1, shared", 256, 128, 8, 1, 1, RoutingMode::kUniform, {150, 230}},
      {"top-1, every row on expert 0, a rank without tokens, no shared", 256, 192, 8, 1, 0,
       RoutingMode::kSameExperts, {120, 0, 200, 90}},
      {"top-3, every row on experts 0..2 (all rank 0's), shared", 256, 128, 8, 3, 1, RoutingMode::kSameExperts,
       {300, 170}},
      {"no shared, three ranks without tokens", 512, 256, 16, 2, 0, RoutingMode::kSkewed,
       {0, 100, 0, 120, 130, 0, 50, 110}},
  };
  for (const LayerCase& c : cases) {
    SCOPED_TRACE(c.what);
    const auto config = layer_config(c.hidden, c.intermediate, c.experts, c.top_k, c.shared, c.tokens);
    const Problem p = make_problem(config, c.mode, 53);
    const Grads g = forward_then_backward(p, {});
    expect_matches_reference(p, g);

    // An expert no row reaches has K = 0: its gradients must still be stored,
    // as exact zeros (the bound above would let small garbage through).
    std::vector<int> rows(static_cast<size_t>(c.experts), 0);
    for (const auto& ids : p.layer.expert_ids) {
      for (int32_t e : ids) ++rows[static_cast<size_t>(e)];
    }
    const size_t per13 = g.dw13.size() / c.experts, per2 = g.dw2.size() / c.experts;
    for (int e = 0; e < c.experts; ++e) {
      if (rows[static_cast<size_t>(e)] > 0) continue;
      const auto zero = [](float v) { return v == 0.0f; };
      EXPECT_TRUE(std::all_of(g.dw13.begin() + e * per13, g.dw13.begin() + (e + 1) * per13, zero))
          << "dW13 of expert " << e << ", which has no rows";
      EXPECT_TRUE(std::all_of(g.dw2.begin() + e * per2, g.dw2.begin() + (e + 1) * per2, zero))
          << "dW2 of expert " << e << ", which has no rows";
    }
  }
}

// The bf16 weight gradients of a WeightGradOutput::kBf16 pass, which fill the
// first half of each (fp32-sized) buffer: every rank's dW13, dW2, shared dW13
// and shared dW2, in that order.
std::vector<uint16_t> bf16_weight_grads(const Outputs& out) {
  std::vector<uint16_t> all;
  for (const auto* buffers : {&out.dw13, &out.dw2, &out.dshared_w13, &out.dshared_w2}) {
    for (const DeviceBytes& b : *buffers) {
      std::vector<uint16_t> v = b.download<uint16_t>();
      all.insert(all.end(), v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2));
    }
  }
  return all;
}

// Recompute mode (BackwardMode::kRecompute): the forward keeps its schedule
// only and the backward recomputes [gate | up] from the pulled x rows. The
// training forward rounds the pre-activations it saves once to bf16 from the
// accumulators h comes from, so a recompute with the same GEMM gives the same
// bf16 pre-activations, and every gradient must be the save mode's, bit for
// bit: a training run may switch modes per layer (memory against one more
// gate/up GEMM) without changing its numbers. Each recompute result is also
// checked against the reference: both modes leaving an element unwritten
// (NaN poison), or wrong alike, would compare equal.
TEST(FusedBackward, RecomputeModeGivesTheSaveModesBits) {
  MOK_REQUIRE_HOPPER();
  const mok::BackwardMode kRecompute = mok::BackwardMode::kRecompute;
  {
    SCOPED_TRACE("shared expert, uniform routing, 2 ranks with uneven tokens");
    const auto config = layer_config(384, 192, 8, 2, 1, {230, 170});
    const Problem p = make_problem(config, RoutingMode::kUniform, 71);
    const SavedPass kept_all = run_training_forward(p, {});
    const SavedPass kept_schedule = run_training_forward(p, {}, kRecompute);
    mok::FusedBackward save(config);
    mok::FusedBackward recompute(config, {}, kRecompute);
    EXPECT_EQ(save.mode(), mok::BackwardMode::kSave);
    EXPECT_EQ(recompute.mode(), kRecompute);
    const Outputs out(config);
    out.poison();
    const Grads baseline = run_backward(save, p, kept_all, out);
    out.poison();
    const Grads g = run_backward(recompute, p, kept_schedule, out);
    expect_matches_reference(p, g);
    expect_same_bits(g, baseline);

    // Another minibatch, lookahead and SM split, for the forward and the
    // backward alike: the recompute tasks move in the pipeline and to other
    // CTAs, their bits must not change.
    mok::FusedForwardOptions options;
    options.minibatch_rows = 128;
    options.lookahead = 1;
    options.ctas_per_rank = 40;
    options.comm_ctas_per_rank = 3;
    {
      SCOPED_TRACE("minibatch_rows 128, lookahead 1, ctas_per_rank 40, comm_ctas_per_rank 3");
      expect_same_bits(forward_then_backward(p, options, kRecompute), baseline);
    }

    // bf16 weight gradients (what the autograd asks for): the same rounding
    // of the same fp32 sums in both modes; dx and dweights keep their bits.
    // The objects above run again, after their fp32 passes.
    const auto bf16_pass = [&](mok::FusedBackward& backward, const SavedPass& saved) {
      out.poison();
      backward.run(backward_tensors(p, saved, out), nullptr, mok::WeightGradOutput::kBf16);
      backward.check();
      return out.download();  // weight gradients: bf16 in each buffer's first half, the poison after it
    };
    const Grads save_bf16 = bf16_pass(save, kept_all);
    const Grads recompute_bf16 = bf16_pass(recompute, kept_schedule);
    {
      SCOPED_TRACE("bf16 weight gradients");
      expect_same_bits(recompute_bf16, save_bf16);
      EXPECT_TRUE(same_bits(recompute_bf16.dx, baseline.dx)) << "dx";
      EXPECT_TRUE(same_bits(recompute_bf16.dweights, baseline.dweights)) << "dweights";
      // Written (poison in both would compare equal): no bf16 NaN of 0xFF bytes.
      const std::vector<uint16_t> bf16 = bf16_weight_grads(out);
      EXPECT_EQ(std::count(bf16.begin(), bf16.end(), uint16_t{0xFFFF}), 0) << "bf16 weight gradients left unwritten";
    }
  }

  const std::vector<LayerCase> cases = {
      {"skewed routing, 4 ranks (one without tokens), no shared expert", 256, 192, 8, 3, 0, RoutingMode::kSkewed,
       {300, 0, 260, 240}},
      {"top-1, every row on expert 0 (the other experts recompute nothing), shared", 256, 128, 8, 1, 1,
       RoutingMode::kSameExperts, {150, 230}},
  };
  for (const LayerCase& c : cases) {
    SCOPED_TRACE(c.what);
    const auto config = layer_config(c.hidden, c.intermediate, c.experts, c.top_k, c.shared, c.tokens);
    const Problem p = make_problem(config, c.mode, 71);
    const Grads save = forward_then_backward(p, {});
    const Grads recompute = forward_then_backward(p, {}, kRecompute);
    expect_matches_reference(p, recompute);
    expect_same_bits(recompute, save);
  }
}

// Objects made for a capacity -- the forward's (RankTensors::tokens) and the
// backward's (BackwardRankTensors::tokens) -- run passes whose token counts
// change from pass to pass below it, and give the exact objects' bits, in
// both modes. One pair of capacity objects serves every count.
TEST(FusedBackward, ACapacityObjectGivesTheExactObjectsBitsAsTokenCountsChange) {
  MOK_REQUIRE_HOPPER();
  const std::vector<int> capacity_counts = {256, 256};
  const auto capacity = layer_config(384, 192, 8, 2, 1, capacity_counts);
  for (const mok::BackwardMode mode : {mok::BackwardMode::kSave, mok::BackwardMode::kRecompute}) {
    const bool save = mode == mok::BackwardMode::kSave;
    SCOPED_TRACE(save ? "save mode" : "recompute mode");
    mok::FusedForward forward(capacity);
    mok::FusedBackward backward(capacity, {}, mode);
    for (const std::vector<int>& counts : {std::vector<int>{230, 170}, std::vector<int>{1, 256}, std::vector<int>{0, 64}}) {
      SCOPED_TRACE("tokens " + std::to_string(counts[0]) + ", " + std::to_string(counts[1]));
      const auto exact = layer_config(384, 192, 8, 2, 1, counts);
      const Problem p = make_problem(exact, RoutingMode::kUniform, 91);
      const Grads want = forward_then_backward(p, {}, mode);

      // The training forward on the capacity object: what it keeps is sized
      // for the capacity (poisoned: rows past the pass's are never read).
      SavedPass saved;
      std::vector<mok::RankTensors> tensors = p.device->tensors();
      for (size_t r = 0; r < tensors.size(); ++r) {
        saved.pass_state.emplace_back(forward.pass_state_bytes()).poison();
        saved.preact.emplace_back(save ? static_cast<size_t>(forward.saved_rows()) * 2 * 192 * 2 : 0).poison();
        saved.shared_preact.emplace_back(save ? static_cast<size_t>(counts[r]) * 2 * capacity.shared_width() * 2 : 0)
            .poison();
        tensors[r].tokens = counts[r];
        tensors[r].pass_state = saved.pass_state.back().get();
        tensors[r].preact = saved.preact.back().get();
        tensors[r].shared_preact = saved.shared_preact.back().get();
      }
      forward.run(tensors);
      forward.check();

      const Outputs out(exact);
      out.poison();
      std::vector<mok::BackwardRankTensors> ranks = backward_tensors(p, saved, out);
      for (size_t r = 0; r < ranks.size(); ++r) ranks[r].tokens = counts[r];
      backward.run(ranks, nullptr, false);
      backward.check();
      expect_same_bits(out.download(), want);
    }
    // More tokens than the capacity is refused before any launch.
    const auto over = layer_config(384, 192, 8, 2, 1, {64, 64});
    const Problem p = make_problem(over, RoutingMode::kUniform, 92);
    const SavedPass saved = run_training_forward(p, {}, mode);
    const Outputs out(over);
    std::vector<mok::BackwardRankTensors> ranks = backward_tensors(p, saved, out);
    ranks[0].tokens = 64;
    ranks[1].tokens = 257;
    EXPECT_THROW(backward.run(ranks, nullptr, false), mok::Error);
  }
}

// Recompute mode reads neither BackwardRankTensors::preact nor shared_preact:
// given buffers of the save mode's sizes full of NaN (0xFF bytes), a pass
// gives the bits it gives with them null (any value read would spread NaN).
// The second pass of one object also shows that the recomputed
// pre-activations of one pass are not left for the next to read.
TEST(FusedBackward, RecomputeModeReadsNoSavedPreActivations) {
  MOK_REQUIRE_HOPPER();
  const auto config = layer_config(512, 320, 16, 4, 1, {260, 190});
  const Problem p = make_problem(config, RoutingMode::kSkewed, 73);
  const SavedPass saved = run_training_forward(p, {}, mok::BackwardMode::kRecompute);
  mok::FusedBackward backward(config, {}, mok::BackwardMode::kRecompute);
  const Outputs out(config);
  out.poison();
  const Grads g = run_backward(backward, p, saved, out);
  expect_matches_reference(p, g);

  std::vector<DeviceBytes> preact, shared_preact;  // [R]
  std::vector<mok::BackwardRankTensors> ranks = backward_tensors(p, saved, out);
  for (int r = 0; r < config.world_size; ++r) {
    const size_t T = static_cast<size_t>(config.tokens_per_rank[static_cast<size_t>(r)]);
    preact.emplace_back(static_cast<size_t>(mok::FusedForward::saved_rows_for(config)) * 2 * config.intermediate * 2)
        .poison();
    shared_preact.emplace_back(T * 2 * config.shared_width() * 2).poison();
    ranks[static_cast<size_t>(r)].preact = preact.back().get();
    ranks[static_cast<size_t>(r)].shared_preact = shared_preact.back().get();
  }
  out.poison();
  backward.run(ranks);
  backward.check();
  expect_same_bits(out.download(), g);
}

// Bounded waits: with a timeout far shorter than any wait of the pass, the
// first wait that gives up stops every role of every rank, the kernel ends
// (no hang), and check() names the counter, the ranks and the values. The
// object then runs a normal pass again (its counters are zeroed per pass).
TEST(FusedBackward, AWaitPastItsTimeoutIsAnErrorNamingItsCounterNotAHang) {
  MOK_REQUIRE_HOPPER();
  const auto config = layer_config(512, 320, 16, 4, 1, {260, 190});
  const Problem p = make_problem(config, RoutingMode::kUniform, 61);
  const SavedPass saved = run_training_forward(p, {});
  mok::FusedForwardOptions impatient;
  impatient.timeout_seconds = 1e-6;
  mok::FusedBackward backward(config, impatient);
  const Outputs out(config);
  out.poison();
  backward.run(backward_tensors(p, saved, out));
  try {
    backward.check();
    ADD_FAILURE() << "a pass with a 1 us timeout reported no stall";
  } catch (const mok::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("waited on"), std::string::npos) << what;
    EXPECT_NE(what.find("before the timeout"), std::string::npos) << what;
  }
  mok::FusedBackward patient(config);
  out.poison();
  expect_matches_reference(p, run_backward(patient, p, saved, out));
}

// A pass state from a forward of more tokens than the FusedBackward was made
// for holds a longer schedule than its buffers: the pass stops with an error
// that says so, before it moves a row (it used to write past the buffers).
TEST(FusedBackward, AScheduleLongerThanItsBuffersIsAnErrorNotAnOverrun) {
  MOK_REQUIRE_HOPPER();
  const auto config = layer_config(256, 128, 8, 4, 1, {2000, 1500});
  const Problem p = make_problem(config, RoutingMode::kUniform, 67);
  mok::FusedForwardOptions small_minibatch;
  small_minibatch.minibatch_rows = 128;
  const SavedPass saved = run_training_forward(p, small_minibatch);
  // Made for far fewer tokens: its buffers hold ~1.5k schedule rows a rank,
  // the forward's schedules ~7k.
  const auto fewer = layer_config(256, 128, 8, 4, 1, {60, 40});
  mok::FusedBackward backward(fewer, small_minibatch);
  const Outputs out(fewer);
  out.poison();
  backward.run(backward_tensors(p, saved, out));
  try {
    backward.check();
    ADD_FAILURE() << "a schedule longer than the buffers ran";
  } catch (const mok::Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than the"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("token counts"), std::string::npos) << e.what();
  }
}

// The peer world (one GPU per rank: system-scope counters, one launch per
// GPU, ordered by events; the forward's world code) gives the virtual
// world's bits for the same ranks, in both modes and over repeated passes.
// On one GPU it runs as a world of one rank (the multi-GPU path's code on
// the one GPU: devices = {0}); with more GPUs, as worlds of 2, 4 and 8 ranks
// too, each over its first GPUs.
TEST(FusedBackward, ThePeerWorldGivesTheVirtualWorldsBits) {
  MOK_REQUIRE_HOPPER();
  int gpus = 0;
  MOK_CUDA_CHECK(cudaGetDeviceCount(&gpus));
  const std::vector<std::vector<int>> splits = {{600}, {330, 270}, {200, 0, 240, 160}, {90, 60, 110, 0, 100, 80, 70, 90}};
  for (const std::vector<int>& tokens : splits) {
    const int R = static_cast<int>(tokens.size());
    if (R > gpus) {
      std::printf("  [peer world of %d ranks skipped: %d GPU(s) here]\n", R, gpus);
      continue;
    }
    std::vector<int> devices(static_cast<size_t>(R));
    for (int r = 0; r < R; ++r) devices[static_cast<size_t>(r)] = r;
    const auto config = layer_config(512, 320, 16, 4, 1, tokens);
    for (const mok::BackwardMode mode : {mok::BackwardMode::kSave, mok::BackwardMode::kRecompute}) {
      SCOPED_TRACE("R = " + std::to_string(R) + (mode == mok::BackwardMode::kSave ? ", save" : ", recompute"));
      const Problem virtual_problem = make_problem(config, RoutingMode::kSkewed, 47);
      const Grads want = forward_then_backward(virtual_problem, {}, mode);
      expect_matches_reference(virtual_problem, want);

      const Problem peer_problem = make_problem(config, RoutingMode::kSkewed, 47, devices);
      mok::FusedForwardOptions peer;
      peer.devices = devices;
      const SavedPass saved = run_training_forward(peer_problem, peer, mode);
      mok::FusedBackward backward(config, peer, mode);
      const Outputs out(config, devices);
      for (int pass = 0; pass < 3; ++pass) {  // later passes reuse every workspace and event
        SCOPED_TRACE("pass " + std::to_string(pass));
        out.poison();
        expect_same_bits(run_backward(backward, peer_problem, saved, out), want);
      }
    }
  }
}

// Device-ordered passes (the host never touches the counters after
// creation: the world barrier frames each pass, the two counter sets take
// turns, each cleared at the end of the pass that idles it) give the
// host-ordered bits, pass after pass, in both modes: in the virtual world
// of 1 and 4 ranks (one of them without tokens) and in the peer world of
// one GPU. Five passes: each set serves at least twice.
TEST(FusedBackward, DeviceOrderedPassesGiveTheHostOrderedBits) {
  MOK_REQUIRE_HOPPER();
  struct World { std::vector<int> tokens; std::vector<int> devices; const char* what; };
  for (const World& w : {World{{600}, {}, "virtual, R = 1"}, World{{200, 0, 240, 160}, {}, "virtual, R = 4"},
                         World{{600}, {0}, "peer, R = 1"}}) {
    const auto config = layer_config(512, 320, 16, 4, 1, w.tokens);
    for (const mok::BackwardMode mode : {mok::BackwardMode::kSave, mok::BackwardMode::kRecompute}) {
      SCOPED_TRACE(std::string(w.what) + (mode == mok::BackwardMode::kSave ? ", save" : ", recompute"));
      const Problem p = make_problem(config, RoutingMode::kSkewed, 53, w.devices);
      mok::FusedForwardOptions host;
      host.devices = w.devices;
      const Grads want = forward_then_backward(p, host, mode);
      expect_matches_reference(p, want);

      mok::FusedForwardOptions ordered = host;
      ordered.device_ordered = true;
      const SavedPass saved = run_training_forward(p, ordered, mode);
      mok::FusedBackward backward(config, ordered, mode);
      const Outputs out(config, w.devices);
      for (int pass = 0; pass < 5; ++pass) {
        SCOPED_TRACE("pass " + std::to_string(pass));
        out.poison();
        expect_same_bits(run_backward(backward, p, saved, out), want);
      }
      // A pass below the layer's token counts would leave its idle set's
      // tail stale: refused before launch.
      std::vector<mok::BackwardRankTensors> fewer = backward_tensors(p, saved, out);
      fewer[0].tokens = w.tokens[0] - 8;
      try {
        backward.run(fewer);
        ADD_FAILURE() << "ran a device-ordered pass below the layer's token counts";
      } catch (const mok::Error& e) {
        EXPECT_NE(std::string(e.what()).find("device-ordered"), std::string::npos) << e.what();
      }
    }
  }
}

// The process world (one process per GPU, CUDA IPC, always device-ordered;
// each rank stages the inputs its peers read): a world of one rank on this
// GPU gives the virtual world's bits, in both modes, pass after pass. (Two
// ranks need two GPUs: a rank refuses a peer on its own GPU.) Misuse is a
// clear error: a world's tensors for one rank's object and the reverse, a
// pass before the peers are mapped, a forward's handle given to a backward.
TEST(FusedBackward, AProcessWorldOfOneRankGivesTheVirtualWorldsBits) {
  MOK_REQUIRE_HOPPER();
  const auto config = layer_config(512, 320, 16, 4, 1, {600});
  mok::FusedForwardOptions process;
  process.process_rank = 0;
  for (const mok::BackwardMode mode : {mok::BackwardMode::kSave, mok::BackwardMode::kRecompute}) {
    SCOPED_TRACE(mode == mok::BackwardMode::kSave ? "save" : "recompute");
    const Problem p = make_problem(config, RoutingMode::kSkewed, 61);
    const Grads want = forward_then_backward(p, {}, mode);
    expect_matches_reference(p, want);

    const SavedPass saved = run_training_forward(p, process, mode);
    mok::FusedBackward backward(config, process, mode);
    EXPECT_TRUE(backward.options().device_ordered);
    const Outputs out(config);
    for (int pass = 0; pass < 4; ++pass) {
      SCOPED_TRACE("pass " + std::to_string(pass));
      out.poison();
      backward.run(backward_tensors(p, saved, out)[0]);
      backward.check();
      expect_same_bits(out.download(), want);
    }
  }

  const auto expect_error = [](auto&& call, const std::string& says) {
    try {
      call();
      ADD_FAILURE() << "no error; expected one saying: " << says;
    } catch (const mok::Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  const Problem p = make_problem(config, RoutingMode::kUniform, 67);
  const SavedPass saved = run_training_forward(p, {});
  const Outputs out(config);
  const std::vector<mok::BackwardRankTensors> tensors = backward_tensors(p, saved, out);
  mok::FusedBackward one_rank(config, process);
  expect_error([&] { one_rank.run(tensors); }, "run(mine, stream)");
  mok::FusedBackward virtual_world(config);
  expect_error([&] { virtual_world.run(tensors[0]); }, "only a process world");
  expect_error([&] { (void)virtual_world.export_handle(); }, "only a process world");
  mok::FusedForward forward(config, process);
  expect_error([&] { one_rank.import_peers(std::vector<std::vector<uint8_t>>{forward.export_handle()}); },
               "a forward's and a backward's handles do not mix");
  const auto two_ranks = layer_config(512, 320, 16, 4, 1, {300, 300});
  mok::FusedBackward rank0(two_ranks, process);
  const Problem p2 = make_problem(two_ranks, RoutingMode::kUniform, 67);
  const SavedPass saved2 = run_training_forward(p2, {});
  const Outputs out2(two_ranks);
  expect_error([&] { rank0.run(backward_tensors(p2, saved2, out2)[0]); },
               "import_peers() with every rank's handle first");
  const std::vector<uint8_t> mine = rank0.export_handle();
  expect_error([&] { rank0.import_peers(std::vector<std::vector<uint8_t>>{mine}); }, "got 1 handles");
}

TEST(FusedBackward, RefusesWhatThisVersionDoesNotRun) {
  MOK_REQUIRE_HOPPER();
  // Worlds and pass orders this version does not run, refused at construction
  // with the field named.
  const auto one_rank = layer_config(256, 128, 8, 2, 1, {200});
  const auto expect_refused = [&](const mok::FusedForwardOptions& options, const char* field) {
    try {
      mok::FusedBackward backward(one_rank, options);
      ADD_FAILURE() << "constructed with " << options.describe();
    } catch (const mok::Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  mok::FusedForwardOptions process;
  process.process_rank = 2;  // of a world of one
  expect_refused(process, "process_rank");

  // Missing saved state, refused by run() before any launch: the outputs keep
  // their poison.
  const auto config = layer_config(256, 128, 8, 2, 1, {150, 110});
  const Problem p = make_problem(config, RoutingMode::kUniform, 59);
  const SavedPass saved = run_training_forward(p, {});
  mok::FusedBackward backward(config);
  mok::FusedBackward recompute(config, {}, mok::BackwardMode::kRecompute);
  const Outputs out(config);
  out.poison();
  const auto expect_run_refused = [&](mok::FusedBackward& object, void (*spoil)(mok::BackwardRankTensors&),
                                      const char* field) {
    std::vector<mok::BackwardRankTensors> ranks = backward_tensors(p, saved, out);
    spoil(ranks[1]);
    try {
      object.run(ranks);
      ADD_FAILURE() << "ran without " << field;
    } catch (const mok::Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  expect_run_refused(backward, [](mok::BackwardRankTensors& t) { t.pass_state = nullptr; }, "pass_state");
  expect_run_refused(backward, [](mok::BackwardRankTensors& t) { t.preact = nullptr; }, "preact");
  expect_run_refused(
      backward, [](mok::BackwardRankTensors& t) { t.dout = static_cast<const char*>(t.dout) + 2; }, "dout");
  // Recompute mode reads no preact, but still the schedule.
  expect_run_refused(recompute, [](mok::BackwardRankTensors& t) { t.pass_state = nullptr; }, "pass_state");
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> dx = out.download().dx;
  EXPECT_TRUE(std::all_of(dx.begin(), dx.end(), [](uint16_t v) { return v == 0xFFFF; }))
      << "a refused pass wrote dx";
}

}  // namespace
