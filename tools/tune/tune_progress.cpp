// mok_cli tune's one-line progress display (tune_progress.hpp).
#include "tune/tune_progress.hpp"

#include <unistd.h>

namespace mok::tune {

ProgressLine::ProgressLine(std::FILE* out, double budget_s)
    : out_(out), budget_s_(budget_s), in_place_(isatty(fileno(out)) != 0) {}

std::string ProgressLine::text(const SearchStep& step, double budget_s) {
  char head[96];
  std::snprintf(head, sizeof head, "mok_cli tune: %3.0f/%.0f s, %d timed; ", step.elapsed_s, budget_s, step.timed);
  std::string line = head + describe(step.candidate);
  if (step.ratio) {
    char ratio[48];
    std::snprintf(ratio, sizeof ratio, " -> %.4f of the best", *step.ratio);
    line += ratio;
  } else {
    line += " ...";
  }
  char best[48];
  std::snprintf(best, sizeof best, "; best %.3fx ", step.best_speedup);
  return line + best + describe(step.best);
}

void ProgressLine::operator()(const SearchStep& step) {
  const std::string line = text(step, budget_s_);
  if (in_place_) {
    std::fprintf(out_, "\r\033[K%s", line.c_str());  // \033[K: erase what a longer line left
    showing_ = true;
  } else if (step.ratio) {
    std::fprintf(out_, "%s\n", line.c_str());  // off a terminal, the finished steps only
  }
  std::fflush(out_);
}

void ProgressLine::note(const std::string& message) {
  finish();
  std::fprintf(out_, "%s\n", message.c_str());
  std::fflush(out_);
}

void ProgressLine::finish() {
  if (showing_) std::fprintf(out_, "\n");
  showing_ = false;
  std::fflush(out_);
}

}  // namespace mok::tune
