#include "reference/reference_common.hpp"

#include <algorithm>
#include <exception>
#include <string>
#include <thread>

#include "mok/error.hpp"
#include "plan/implemented_dtype.hpp"

namespace mok::ref {
namespace {

std::string rank_name(int rank) { return "rank " + std::to_string(rank); }

void validate_pointers(const LayerInputs& inputs) {
  const LayerConfig& config = inputs.config;
  if (static_cast<int>(inputs.x.size()) != config.world_size) {
    throw Error("reference: x has " + std::to_string(inputs.x.size()) +
                " ranks; world_size is " + std::to_string(config.world_size));
  }
  for (int r = 0; r < config.world_size; ++r) {
    if (config.tokens_per_rank[r] > 0 && inputs.x[r] == nullptr) {
      throw Error("reference: x of " + rank_name(r) + " is null but it has " +
                  std::to_string(config.tokens_per_rank[r]) + " tokens");
    }
  }
  if (inputs.w13 == nullptr) throw Error("reference: w13 is null");
  if (inputs.w2 == nullptr) throw Error("reference: w2 is null");
  if (config.shared_width() > 0 && (inputs.shared_w13 == nullptr || inputs.shared_w2 == nullptr)) {
    throw Error("reference: shared_w13 and shared_w2 must be given when the shared width is " +
                std::to_string(config.shared_width()));
  }
}

// Checks one receiver's schedule against the routing; see validate_reference.
void validate_receiver(const LayerInputs& inputs, const WorldSchedule& schedule, int q) {
  const LayerConfig& config = inputs.config;
  const RankSchedule& rs = schedule.ranks[q];
  const int num_local = config.experts_per_rank();
  const std::string who = "reference: schedule of " + rank_name(q);
  if (rs.rank != q || rs.first_expert != q * num_local || rs.num_local_experts != num_local) {
    throw Error(who + " names rank " + std::to_string(rs.rank) + ", experts [" +
                std::to_string(rs.first_expert) + ", +" + std::to_string(rs.num_local_experts) +
                "); expected rank " + std::to_string(q) + ", experts [" +
                std::to_string(q * num_local) + ", +" + std::to_string(num_local) + ")");
  }
  if (static_cast<int>(rs.expert_rows.size()) != num_local ||
      static_cast<int>(rs.expert_offset.size()) != num_local + 1 ||
      rs.expert_offset.front() != 0 || static_cast<int64_t>(rs.rows.size()) != rs.padded_rows()) {
    throw Error(who + " has inconsistent expert_rows / expert_offset / rows sizes");
  }
  const int k = config.top_k;
  for (int e = 0; e < num_local; ++e) {
    const int32_t begin = rs.expert_offset[e];
    const int32_t real_end = begin + rs.expert_rows[e];
    if (rs.expert_rows[e] < 0 || real_end > rs.expert_offset[e + 1]) {
      throw Error(who + ": local expert " + std::to_string(e) + " has " +
                  std::to_string(rs.expert_rows[e]) + " rows, more than its block holds");
    }
    for (int32_t i = begin; i < rs.expert_offset[e + 1]; ++i) {
      const RowSource& row = rs.rows[i];
      const std::string at = who + ", row " + std::to_string(i) + ": ";
      if (i >= real_end) {
        if (!is_padding(row)) throw Error(at + "expected a padding row after the expert's real rows");
        continue;
      }
      if (row.rank < 0 || row.rank >= config.world_size || row.token < 0 ||
          row.token >= config.tokens_per_rank[row.rank] || row.slot < 0 || row.slot >= k) {
        throw Error(at + "source (" + std::to_string(row.rank) + ", " + std::to_string(row.token) +
                    ", " + std::to_string(row.slot) + ") is out of range");
      }
      const int64_t entry = static_cast<int64_t>(row.token) * k + row.slot;
      const int32_t id = inputs.routing[row.rank].expert_ids[entry];
      if (id != rs.first_expert + e) {
        throw Error(at + "holds an entry routed to expert " + std::to_string(id) +
                    " in the block of expert " + std::to_string(rs.first_expert + e));
      }
      if (schedule.combine_row[row.rank][entry] != i) {
        throw Error(at + "combine_row of (" + std::to_string(row.rank) + ", " +
                    std::to_string(row.token) + ", " + std::to_string(row.slot) + ") is " +
                    std::to_string(schedule.combine_row[row.rank][entry]) + ", not this row");
      }
    }
  }
}

}  // namespace

void validate_reference(const LayerInputs& inputs, const WorldSchedule& schedule,
                        const ReferenceOptions& options, bool fp8_allowed) {
  const LayerConfig& config = inputs.config;
  validate(config);
  // The forward computes the FP8 recipe (block-scaled e4m3 routed experts,
  // include/mok/reference.hpp); anything else of fp8 would silently get bf16
  // results.
  if (config.dtype == DType::kFP8E4M3 && fp8_allowed) {
    require(options.precision == RefPrecision::kFP32, "precision", static_cast<int>(options.precision),
            "must be kFP32 for an fp8 layer (the FP8 recipe's rounding is fp32's)");
    require(config.hidden % 128 == 0, "hidden", config.hidden,
            "must be a multiple of 128 for fp8 (1 x 128 and 128 x 128 scale blocks)");
    require(config.intermediate % 128 == 0, "intermediate", config.intermediate,
            "must be a multiple of 128 for fp8 (1 x 128 and 128 x 128 scale blocks)");
  } else {
    plan::require_implemented_dtype(config, fp8_allowed ? "the CPU reference" : "the CPU reference backward");
  }
  validate_routing(config, inputs.routing, /*check_weights=*/true);
  validate_pointers(inputs);
  require(options.num_threads >= 1, "num_threads", options.num_threads, "must be >= 1");
  require(options.precision == RefPrecision::kFP32 || options.precision == RefPrecision::kFP64,
          "precision", static_cast<int>(options.precision), "must be kFP32 or kFP64");

  const int R = config.world_size;
  if (static_cast<int>(schedule.ranks.size()) != R || schedule.top_k != config.top_k ||
      static_cast<int>(schedule.combine_row.size()) != R) {
    throw Error("reference: the schedule has " + std::to_string(schedule.ranks.size()) +
                " ranks, top_k " + std::to_string(schedule.top_k) + " and " +
                std::to_string(schedule.combine_row.size()) +
                " combine maps; the config has world_size " + std::to_string(R) + ", top_k " +
                std::to_string(config.top_k));
  }
  int64_t scheduled = 0;
  for (int r = 0; r < R; ++r) {
    const size_t entries = static_cast<size_t>(config.tokens_per_rank[r]) * config.top_k;
    if (schedule.combine_row[r].size() != entries) {
      throw Error("reference: combine_row of " + rank_name(r) + " has " +
                  std::to_string(schedule.combine_row[r].size()) + " entries; expected " +
                  std::to_string(entries) + " (tokens * top_k); was the schedule built for "
                  "other routing?");
    }
  }
  for (int q = 0; q < R; ++q) {
    validate_receiver(inputs, schedule, q);
    for (int32_t rows : schedule.ranks[q].expert_rows) scheduled += rows;
  }
  // Every real row points at a distinct entry (combine_row is a function that
  // maps it back to the row), so equal counts make rows and entries a bijection.
  if (scheduled != config.total_tokens() * config.top_k) {
    throw Error("reference: the schedule has " + std::to_string(scheduled) +
                " real rows; the routing has " +
                std::to_string(config.total_tokens() * config.top_k) + " (token, slot) entries");
  }
}

std::span<const RowSource> expert_rows(const WorldSchedule& schedule, const LayerConfig& config,
                                       int expert) {
  const RankSchedule& rs = schedule.ranks[config.expert_owner(expert)];
  const int local = expert - rs.first_expert;
  return {rs.rows.data() + rs.expert_offset[local], static_cast<size_t>(rs.expert_rows[local])};
}

FfnWeights routed_weights(const LayerInputs& inputs, int expert) {
  const int64_t H = inputs.config.hidden;
  const int64_t I = inputs.config.intermediate;
  return {inputs.w13 + expert * 2 * I * H, inputs.w2 + expert * H * I, inputs.config.hidden,
          inputs.config.intermediate};
}

FfnWeights shared_weights(const LayerInputs& inputs) {
  return {inputs.shared_w13, inputs.shared_w2, inputs.config.hidden, inputs.config.shared_width()};
}

void parallel_for(int threads, int64_t count, const std::function<void(int64_t, int64_t)>& body) {
  const int64_t workers = std::min<int64_t>(threads, count);
  if (workers <= 1) {
    if (count > 0) body(0, count);
    return;
  }
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> failure(static_cast<size_t>(workers));
  for (int64_t w = 0; w < workers; ++w) {
    pool.emplace_back([&, w] {
      try {
        body(count * w / workers, count * (w + 1) / workers);
      } catch (...) {
        failure[w] = std::current_exception();
      }
    });
  }
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& e : failure) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace mok::ref
