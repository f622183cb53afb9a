#include "world/forward_options.hpp"

#include <algorithm>
#include <string>

#include "mok/error.hpp"
#include "plan/implemented_dtype.hpp"
#include "plan/sm_split.hpp"
#include "protocol/ring_scales.hpp"

namespace mok {

std::string FusedForwardOptions::describe() const {
  // Appended piece by piece: GCC 12 warns (-Wrestrict, falsely) on
  // "literal" + std::string temporaries here.
  std::string text = "world=";
  if (process_rank >= 0) {
    text += "process (rank ";
    text += std::to_string(process_rank);
    text += ")";
  } else if (!devices.empty()) {
    text += "peer (GPUs";
    for (int d : devices) {
      text += ' ';
      text += std::to_string(d);
    }
    text += ")";
  } else {
    text += "virtual";
  }
  if (device_ordered || process_rank >= 0) text += " device_ordered";
  text += " minibatch_rows=" + std::to_string(minibatch_rows);
  text += " ring_slots=" + std::to_string(ring_slots);
  text += " lookahead=" + std::to_string(lookahead);
  text += " ctas_per_rank=" + std::to_string(ctas_per_rank);
  text += " comm_ctas_per_rank=" + std::to_string(comm_ctas_per_rank);
  text += " timeout=" + std::to_string(timeout_seconds) + "s";
  return text;
}

}  // namespace mok

namespace mok::world {
namespace {

// The FP8 forward's shape rules (docs/fp8-forward-design.md): its scale
// blocks are 128 columns of a row and 128 x 128 of a weight, and its tiles
// never hold part of one. The shared expert stays bf16 (validate()'s rules).
void require_fp8_shape(const LayerConfig& config) {
  require(config.hidden % 256 == 0, "hidden", config.hidden,
          "must be a multiple of 256 for fp8: the FP8 down GEMM's n-tiles are 256 columns (two 128 x 128 "
          "weight scale blocks, one per consumer warpgroup) and none may be partial; x rows quantize in 1 x 128 "
          "blocks");
  require(config.intermediate % 128 == 0, "intermediate", config.intermediate,
          "must be a multiple of 128 for fp8: each gate/up tile quantizes 128 h columns (one scale block), "
          "and the down GEMM's K steps are 128 x 128 weight scale blocks");
}

// What the kernel itself cannot do, whatever the options.
void require_kernel_limits(const LayerConfig& config, const KernelFacts& kernel) {
  if (config.dtype == DType::kFP8E4M3) {
    require_fp8_shape(config);
    // The down GEMM's K (hidden is bounded below, by the copy slots).
    require(config.intermediate <= kernel.max_fp8_k, "intermediate", config.intermediate,
            ("the FP8 forward supports intermediate <= " + std::to_string(kernel.max_fp8_k) +
             " (a tile's weight scales are staged in shared memory, one pair per 128 of K)").c_str());
  } else {
    plan::require_implemented_dtype(config, "the fused forward");
  }
  require(config.top_k <= kernel.max_top_k, "top_k", config.top_k,
          ("the fused forward supports top_k <= " + std::to_string(kernel.max_top_k)).c_str());
  require(config.hidden <= kernel.max_hidden, "hidden", config.hidden,
          ("the fused forward supports hidden <= " + std::to_string(kernel.max_hidden) +
           " (one x row per dispatch copy slot)").c_str());
  require(config.experts_per_rank() <= kernel.max_local_experts, "num_experts / world_size",
          config.experts_per_rank(),
          ("the fused forward supports at most " + std::to_string(kernel.max_local_experts) + " experts per rank")
              .c_str());
}

void require_ring(const FusedForwardOptions& o, const KernelFacts& kernel) {
  const std::string tile = std::to_string(kernel.tile_m);
  require(o.minibatch_rows >= kernel.tile_m && o.minibatch_rows % kernel.tile_m == 0, "minibatch_rows",
          o.minibatch_rows, ("must be a positive multiple of " + tile + " (the GEMM tile height)").c_str());
  require(o.minibatch_rows <= kMaxMinibatchRows, "minibatch_rows", o.minibatch_rows,
          "must be <= 2^29: the kernel adds a minibatch to a schedule's row count (up to 2^30 + padding) in "
          "32-bit arithmetic");
  require(o.ring_slots >= 1, "ring_slots", o.ring_slots, "must be >= 1");
  require(o.ring_slots <= kMaxRingRows / o.minibatch_rows, "ring_slots", o.ring_slots,
          ("times minibatch_rows = " + std::to_string(o.minibatch_rows) +
           " (the ring's rows) must be <= 2^30: the kernel counts ring rows and tiles in 32-bit arithmetic")
              .c_str());
  require(o.lookahead >= 1, "lookahead", o.lookahead, "must be >= 1");
}

// The FP8 kernel's producer finds a tile's scales at k-block x pitch + row in
// 32-bit arithmetic (gemm/fp8_stage_scales.cuh; the layout is
// protocol/ring_scales.hpp's): the ring's scale arrays must have fewer than
// 2^31 entries.
void require_fp8_ring(const LayerConfig& config, const FusedForwardOptions& o) {
  const long long ring_rows = static_cast<long long>(o.ring_slots) * o.minibatch_rows;
  const long long widest = std::max(config.hidden, config.intermediate) / 128;
  require(protocol::ring_scale_pitch(ring_rows) * widest < (1ll << 31), "ring_slots", o.ring_slots,
          ("times minibatch_rows = " + std::to_string(o.minibatch_rows) + " times max(hidden, intermediate) / 128 = " +
           std::to_string(widest) + " must stay below 2^31 for fp8: the kernel indexes the ring's scales in 32-bit "
           "arithmetic").c_str());
}

void require_timeouts(const FusedForwardOptions& o) {
  // Above 8 s the kernel's 10 s mbarrier trap (ptx/async_copy.cuh) could fire
  // before a protocol wait reports its stall.
  require(o.timeout_seconds > 0 && o.timeout_seconds <= 8, "timeout_seconds", o.timeout_seconds,
          "must be in (0, 8]");
  // Barrier waits hold no mbarrier (nothing else of the CTA waits on one
  // meanwhile), so they may wait longer than the protocol's bound.
  require(o.barrier_timeout_seconds > 0 && o.barrier_timeout_seconds <= 3600, "barrier_timeout_seconds",
          o.barrier_timeout_seconds, "must be in (0, 3600]");
  if (o.device_ordered || o.process_rank >= 0) {
    // An aborting peer may take up to timeout_seconds to reach the end of its
    // pass; a shorter barrier bound would break the world on a mere stall.
    require(o.barrier_timeout_seconds > o.timeout_seconds, "barrier_timeout_seconds", o.barrier_timeout_seconds,
            "must exceed timeout_seconds (a peer may take that long to end an aborted pass)");
  }
}

void require_world(const LayerConfig& config, const FusedForwardOptions& o, const GpuFacts& gpus) {
  const int R = config.world_size;
  require(o.trace_events >= 0, "trace_events", o.trace_events, "must be >= 0 (0: no trace)");
  require(o.trace_events == 0 || (!o.device_ordered && o.process_rank < 0), "trace_events", o.trace_events,
          "tracing is supported in host-ordered worlds only (not with device_ordered or a process world)");
  if (o.process_rank >= 0) {
    require(o.process_rank < R, "process_rank", o.process_rank,
            ("must be -1 (no process world) or a rank in [0, " + std::to_string(R) + ")").c_str());
    require(o.devices.empty(), "devices.size()", o.devices.size(),
            "must be empty in a process world (each process serves its rank on its current GPU)");
  }
  if (o.devices.empty()) return;
  require(static_cast<int>(o.devices.size()) == R, "devices.size()", o.devices.size(),
          "must equal world_size (one GPU per rank), or be empty for the virtual world");
  const int count = static_cast<int>(gpus.sm_count.size());
  for (int r = 0; r < R; ++r) {
    const std::string field = "devices[" + std::to_string(r) + "]";
    require(o.devices[r] >= 0 && o.devices[r] < count, field.c_str(), o.devices[r],
            ("must name one of the " + std::to_string(count) + " visible GPUs").c_str());
    for (int q = 0; q < r; ++q) {
      require(o.devices[q] != o.devices[r], field.c_str(), o.devices[r],
              "must differ from every other rank's GPU (one rank per GPU)");
    }
  }
}

}  // namespace

WorldKind world_kind(const FusedForwardOptions& options) {
  if (options.process_rank >= 0) return WorldKind::kProcess;
  return options.devices.empty() ? WorldKind::kVirtual : WorldKind::kPeer;
}

const char* world_kind_name(WorldKind kind) {
  switch (kind) {
    case WorldKind::kVirtual: return "virtual";
    case WorldKind::kPeer: return "peer";
    case WorldKind::kProcess: return "process";
  }
  return "unknown";
}

uint32_t forward_n_major_kinds(const LayerConfig& config, const FusedForwardOptions& resolved, const GpuFacts& gpus,
                               const KernelFacts& kernel, int32_t gate_up_kind, int32_t gate_up_n_tiles) {
  const size_t device = static_cast<size_t>(gpus.current_device);
  if (device >= gpus.l2_bytes.size() || gpus.l2_bytes[device] <= 0 || gate_up_kind < 0 || gate_up_kind >= 32) {
    return 0;
  }
  const long long element_bytes = config.dtype == DType::kFP8E4M3 ? 1 : 2;
  const long long w13_bytes = 2ll * config.intermediate * config.hidden * element_bytes;
  long long tokens = 0;
  for (int t : config.tokens_per_rank) tokens += t;
  const long long rows_per_expert = tokens * config.top_k / config.num_experts;  // uniform routing
  const long long expert_m_tiles = (rows_per_expert + kernel.tile_m - 1) / kernel.tile_m;
  const long long gemm_ctas = resolved.ctas_per_rank - resolved.comm_ctas_per_rank;
  const bool wide_experts =
      2 * w13_bytes > gpus.l2_bytes[device] && 2 * expert_m_tiles * gate_up_n_tiles > 3 * gemm_ctas;
  return wide_experts ? (1u << gate_up_kind) : 0u;
}

std::vector<int> rank_devices(const LayerConfig& config, const FusedForwardOptions& options, const GpuFacts& gpus) {
  if (world_kind(options) == WorldKind::kPeer) return options.devices;
  return std::vector<int>(static_cast<size_t>(config.world_size), gpus.current_device);
}

FusedForwardOptions resolve_options(const LayerConfig& config, const FusedForwardOptions& options,
                                    const KernelFacts& kernel, const GpuFacts& gpus) {
  validate(config);
  require_kernel_limits(config, kernel);
  FusedForwardOptions o = options;
  require_ring(o, kernel);
  if (config.dtype == DType::kFP8E4M3) require_fp8_ring(config, o);
  require_timeouts(o);
  require_world(config, o, gpus);
  const WorldKind kind = world_kind(o);
  if (kind == WorldKind::kProcess) o.device_ordered = true;  // no host can order the processes' GPUs
  require(gpus.current_device >= 0 && gpus.current_device < static_cast<int>(gpus.sm_count.size()),
          "current GPU", gpus.current_device, "must be one of the visible GPUs");

  // SMs per rank: a partition of one GPU (virtual) or a whole GPU (peer, process).
  const std::vector<int> devices = rank_devices(config, o, gpus);
  int sms = gpus.sm_count[static_cast<size_t>(devices[0])];
  for (int d : devices) sms = std::min(sms, gpus.sm_count[static_cast<size_t>(d)]);
  const int ranks_per_gpu = kind == WorldKind::kVirtual ? config.world_size : 1;
  if (o.ctas_per_rank == 0) o.ctas_per_rank = sms / ranks_per_gpu;
  // As many dispatch CTAs as the layer's bytes per FLOP need (plan/sm_split.hpp).
  if (o.comm_ctas_per_rank == 0) o.comm_ctas_per_rank = plan::default_dispatch_ctas(config, o.ctas_per_rank);
  require(o.ctas_per_rank >= 1 && o.ctas_per_rank * ranks_per_gpu <= sms, "ctas_per_rank", o.ctas_per_rank,
          std::string("must be >= 1, and times the ranks per GPU must not exceed the " + std::to_string(sms) +
               " SMs: every CTA must be resident at once")
              .c_str());
  require(o.comm_ctas_per_rank >= 1 && o.comm_ctas_per_rank < o.ctas_per_rank, "comm_ctas_per_rank",
          o.comm_ctas_per_rank, "must be >= 1 and leave at least one GEMM CTA per rank");
  return o;
}

}  // namespace mok::world
