// torch.ops.mok.staged_schedule: the staged backward's row tables from the
// training forward's saved schedule in one launch
// (include/mok/staged_schedule.hpp) -- the eager CUDA path of
// python/mok/staged_backward.py's saved_schedule, which stays the reference
// (a GPU test holds the two together) and what torch.compile traces.
//   schedule_rows[r]  int32 [rows_per_rank, 3]   rank r's saved (home, token, slot) rows
//   expert_offset[r]  int32 [E/R + 1]           its last entry: where rank r's schedule ends
//   tokens_per_rank   the ranks' token counts;  top_k: k
// -> entry_of_row int64 [R rows_per_rank], row_of_entry int64 [T k],
//    token_of_row int64 [R rows_per_rank]  (Schedule's first three fields).
// Kernels: CUDA, Meta (shapes only), CPU (refuses).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "mok/staged_schedule.hpp"
#include "op_checks.hpp"
#include "op_errors.hpp"
#include "op_outputs.hpp"

namespace {

using mok::torch_ops::at_rank;
using mok::torch_ops::check_tensor;
using mok::torch_ops::expect;
using mok::torch_ops::num;
using mok::torch_ops::TensorSpec;

using Tables = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

const TensorSpec kRowsSpec{at::kInt, 2};
const TensorSpec kOffsetSpec{at::kInt, 1};

// Checks the arguments; returns (rows per rank, the world's tokens).
std::pair<int64_t, int64_t> check_staged_schedule(at::TensorList schedule_rows,
                                                  at::TensorList expert_offset,
                                                  at::IntArrayRef tokens_per_rank, int64_t top_k) {
  const size_t R = schedule_rows.size();
  expect(R >= 1 && R <= static_cast<size_t>(mok::kMaxScheduleRanks),
         "staged_schedule: schedule_rows must hold 1 to " + num(mok::kMaxScheduleRanks) + " ranks' rows (got " +
             num(static_cast<int64_t>(R)) + ")");
  expect(expert_offset.size() == R && tokens_per_rank.size() == R,
         "staged_schedule: schedule_rows, expert_offset and tokens_per_rank must have one entry a rank (got " +
             num(static_cast<int64_t>(R)) + ", " + num(static_cast<int64_t>(expert_offset.size())) + ", " +
             num(static_cast<int64_t>(tokens_per_rank.size())) + ")");
  expect(top_k >= 1, "staged_schedule: top_k = " + num(top_k) + " must be >= 1");
  expect(schedule_rows[0].defined(), "staged_schedule: schedule_rows[0] is undefined");
  const at::Device device = schedule_rows[0].device();
  mok::torch_ops::expect_cuda(device, "schedule_rows[0]");
  const int64_t rows_per_rank = schedule_rows[0].dim() == 2 ? schedule_rows[0].size(0) : 0;
  int64_t tokens = 0;
  for (size_t r = 0; r < R; ++r) {
    check_tensor(schedule_rows[r], "schedule_rows" + at_rank(static_cast<int64_t>(r)), kRowsSpec, device,
                 "schedule_rows[0] is on");
    mok::torch_ops::check_shape(schedule_rows[r], "schedule_rows" + at_rank(static_cast<int64_t>(r)),
                                {rows_per_rank, 3}, "[rows of rank 0, 3]");
    check_tensor(expert_offset[r], "expert_offset" + at_rank(static_cast<int64_t>(r)), kOffsetSpec, device,
                 "schedule_rows[0] is on");
    expect(expert_offset[r].size(0) >= 1, "staged_schedule: expert_offset" + at_rank(static_cast<int64_t>(r)) +
                                              " is empty (it ends with the schedule's end)");
    expect(tokens_per_rank[r] >= 0, "staged_schedule: tokens_per_rank" + at_rank(static_cast<int64_t>(r)) +
                                        " = " + num(tokens_per_rank[r]) + " must be >= 0");
    tokens += tokens_per_rank[r];
  }
  return {rows_per_rank, tokens};
}

Tables empty_tables(int64_t num_rows, int64_t entries, const at::TensorOptions& options) {
  const at::TensorOptions longs = options.dtype(at::kLong);
  return {mok::torch_ops::written_output({num_rows}, longs), mok::torch_ops::written_output({entries}, longs),
          mok::torch_ops::written_output({num_rows}, longs)};
}

Tables staged_schedule(at::TensorList schedule_rows, at::TensorList expert_offset,
                       at::IntArrayRef tokens_per_rank, int64_t top_k) {
  const auto [rows_per_rank, tokens] = check_staged_schedule(schedule_rows, expert_offset, tokens_per_rank, top_k);
  const c10::cuda::CUDAGuard guard(schedule_rows[0].device());
  const int64_t R = static_cast<int64_t>(schedule_rows.size());
  Tables out = empty_tables(R * rows_per_rank, tokens * top_k, schedule_rows[0].options());
  mok::StagedScheduleArgs args;
  int64_t first = 0;
  for (int64_t r = 0; r < R; ++r) {
    args.rows[r] = schedule_rows[r].data_ptr<int32_t>();
    args.schedule_end[r] = expert_offset[r].data_ptr<int32_t>() + (expert_offset[r].size(0) - 1);
    args.first_token[r] = first;
    first += tokens_per_rank[r];
  }
  args.ranks = static_cast<int>(R);
  args.rows_per_rank = rows_per_rank;
  args.tokens = tokens;
  args.k = mok::torch_ops::checked_int(top_k, "top_k");
  args.entry_of_row = std::get<0>(out).data_ptr<int64_t>();
  args.row_of_entry = std::get<1>(out).data_ptr<int64_t>();
  args.token_of_row = std::get<2>(out).data_ptr<int64_t>();
  mok::torch_ops::raising_torch_errors([&] {
    mok::staged_schedule(args, c10::cuda::getCurrentCUDAStream(schedule_rows[0].device().index()).stream());
  });
  return out;
}

Tables staged_schedule_meta(at::TensorList schedule_rows, at::TensorList expert_offset,
                            at::IntArrayRef tokens_per_rank, int64_t top_k) {
  const auto [rows_per_rank, tokens] = check_staged_schedule(schedule_rows, expert_offset, tokens_per_rank, top_k);
  const int64_t R = static_cast<int64_t>(schedule_rows.size());
  return empty_tables(R * rows_per_rank, tokens * top_k, schedule_rows[0].options());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mok, m) {
  m.def("staged_schedule(Tensor[] schedule_rows, Tensor[] expert_offset, int[] tokens_per_rank, int top_k) -> "
        "(Tensor entry_of_row, Tensor row_of_entry, Tensor token_of_row)");
}

TORCH_LIBRARY_IMPL(mok, CUDA, m) { m.impl("staged_schedule", &staged_schedule); }
TORCH_LIBRARY_IMPL(mok, Meta, m) { m.impl("staged_schedule", &staged_schedule_meta); }
// CPU tensors reach the checks, which refuse them by name.
TORCH_LIBRARY_IMPL(mok, CPU, m) { m.impl("staged_schedule", &staged_schedule); }
