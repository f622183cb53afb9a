// Host builder of the WorldSchedule: runs the rule of schedule_rules.hpp once
// per receiver rank. Receivers are independent, so they may be built on
// several threads; each writes only its own RankSchedule and its own entries
// of the combine map, so the result cannot depend on the thread count.
#include "mok/schedule.hpp"

#include <algorithm>
#include <thread>

#include "mok/error.hpp"
#include "plan/schedule_rules.hpp"

namespace mok {
namespace {

void build_receiver(const LayerConfig& config, const std::vector<plan::RoutingIds>& world,
                    int receiver, int tile_rows, RankSchedule& out,
                    const std::vector<int32_t*>& combine_row) {
  const int num_local = config.experts_per_rank();
  out.rank = receiver;
  out.first_expert = receiver * num_local;
  out.num_local_experts = num_local;
  out.tile_rows = tile_rows;
  out.expert_rows.assign(static_cast<size_t>(num_local), 0);
  out.expert_offset.assign(static_cast<size_t>(num_local) + 1, 0);

  plan::count_expert_rows(world.data(), config.world_size, config.top_k, out.first_expert,
                          num_local, out.expert_rows.data());
  int64_t padded = 0;
  for (int32_t rows : out.expert_rows) padded += plan::round_up(rows, tile_rows);
  require(padded < (int64_t{1} << 31), "padded rows of a rank", padded,
          "must fit int32; lower tile_rows or tokens");
  plan::padded_offsets(out.expert_rows.data(), num_local, tile_rows, out.expert_offset.data());

  out.rows.resize(static_cast<size_t>(padded));
  std::vector<int32_t> cursor(static_cast<size_t>(num_local));
  plan::fill_rows(world.data(), config.world_size, config.top_k, out.first_expert, num_local,
                  out.expert_rows.data(), out.expert_offset.data(), cursor.data(), out.rows.data(),
                  combine_row.data());
}

}  // namespace

WorldSchedule build_schedule(const LayerConfig& config, std::span<const RankRouting> routing,
                             const ScheduleOptions& options) {
  validate(config);
  validate_routing(config, routing, /*check_weights=*/false);
  require(options.tile_rows >= 1 && options.tile_rows <= 4096, "tile_rows", options.tile_rows,
          "must be in [1, 4096]");
  require(options.num_threads >= 1, "num_threads", options.num_threads, "must be >= 1");

  const int world_size = config.world_size;
  std::vector<plan::RoutingIds> world(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) world[r] = {routing[r].expert_ids, routing[r].tokens};

  WorldSchedule schedule;
  schedule.top_k = config.top_k;
  schedule.ranks.resize(static_cast<size_t>(world_size));
  schedule.combine_row.resize(static_cast<size_t>(world_size));
  std::vector<int32_t*> combine_row(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    // -1 marks an entry no receiver claimed; after the build none may remain.
    schedule.combine_row[r].assign(static_cast<size_t>(routing[r].tokens) * config.top_k, -1);
    combine_row[r] = schedule.combine_row[r].data();
  }

  const int threads = std::min(options.num_threads, world_size);
  if (threads <= 1) {
    for (int q = 0; q < world_size; ++q) {
      build_receiver(config, world, q, options.tile_rows, schedule.ranks[q], combine_row);
    }
  } else {
    std::vector<std::thread> pool;
    std::vector<std::exception_ptr> failure(static_cast<size_t>(threads));
    for (int w = 0; w < threads; ++w) {
      pool.emplace_back([&, w] {
        try {
          for (int q = w; q < world_size; q += threads) {
            build_receiver(config, world, q, options.tile_rows, schedule.ranks[q], combine_row);
          }
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
  return schedule;
}

}  // namespace mok
