// mok_cli tune's progress display: one line on stderr, rewritten in place on
// a terminal (the candidate being timed, the best so far, elapsed / budget),
// one line per step otherwise (a log file should not fill with carriage
// returns). Notes (a refused candidate) go on lines of their own.
#pragma once

#include <cstdio>
#include <string>

#include "tune/tune_search.hpp"

namespace mok::tune {

class ProgressLine {
 public:
  ProgressLine(std::FILE* out, double budget_s);
  void operator()(const SearchStep& step);
  void note(const std::string& message);
  void finish();  // ends the line in place, if one is showing

  // The text of a step, without the line handling (tests read it).
  static std::string text(const SearchStep& step, double budget_s);

 private:
  std::FILE* out_;
  double budget_s_;
  bool in_place_;
  bool showing_ = false;
};

}  // namespace mok::tune
