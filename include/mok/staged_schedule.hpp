// The staged backward's row tables from the training forward's saved
// schedule, in one launch: which (token, slot) entry each saved row holds,
// and the row each entry sits in. python/mok/staged_backward.py's
// saved_schedule computes the same with ~13 torch ops (its docstring is the
// contract; that Python stays the reference, and torch.compile traces it);
// this is its eager CUDA path, run in the training forward's autograd setup,
// where those ops' host time (~0.5 ms a call) left a small layer's GPU idle.
// Host API only.
//
// A world of `ranks` virtual ranks, each with `rows_per_rank` saved rows:
//   rows[r]          int32 [rows_per_rank][3]  (home rank, token, slot) of each of rank r's
//                                              rows; home -1: a padding row
//   schedule_end[r]  int32, device            rank r's rows before it are its schedule; the
//                                              rest of its capacity is unused
//   first_token[r]   host                     rank r's first global token (token order of
//                                              the ranks' tokens concatenated)
// Global row i = r * rows_per_rank + j is real when j < *schedule_end[r] and
// its home >= 0. Outputs:
//   token_of_row  int64 [ranks * rows_per_rank]  global token of a real row (token + the
//                                                home's first token), else 0
//   entry_of_row  int64 [ranks * rows_per_rank]  token_of_row * k + slot of a real row, else
//                                                the dummy entry tokens * k
//   row_of_entry  int64 [tokens * k]             the real row holding each entry; 0 for an
//                                                entry no row holds (a bad expert id kept it
//                                                out of the schedule)
// Each entry is held by at most one real row (the forward schedules every
// (token, slot) once), so each row_of_entry element has at most one writer:
// the tables are the same every run. An entry outside [0, tokens * k) writes
// nothing. Asynchronous on `stream` (a memset and a kernel), no host
// synchronisation; bad arguments throw mok::Error before anything is enqueued.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace mok {

inline constexpr int kMaxScheduleRanks = 64;

struct StagedScheduleArgs {
  const int32_t* rows[kMaxScheduleRanks] = {};
  const int32_t* schedule_end[kMaxScheduleRanks] = {};
  int64_t first_token[kMaxScheduleRanks] = {};
  int ranks = 0;
  int64_t rows_per_rank = 0;
  int64_t tokens = 0;  // the world's
  int k = 0;
  int64_t* token_of_row = nullptr;
  int64_t* entry_of_row = nullptr;
  int64_t* row_of_entry = nullptr;
};

void validate_staged_schedule(const StagedScheduleArgs& args);
void staged_schedule(const StagedScheduleArgs& args, CUstream_st* stream = nullptr);

}  // namespace mok
