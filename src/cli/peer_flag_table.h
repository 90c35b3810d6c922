// Flags of vLLM's or SGLang's with nothing to set in glmserve, kept as tables of one line each: a
// flag is taken with a start-up note saying what glmserve does instead, or refused saying why and
// what to do. vllm_flags.cpp and sglang_flags.cpp hold the tables.
#pragma once

#include <map>
#include <span>
#include <string>
#include <vector>

namespace CLI { class Option_group; }

namespace glms::cli {

// What follows a flag on the command line.
enum class FlagValues { kNone, kOne, kSeveral };  // a switch; one value; one or more (nargs "+")

struct FlagWithNothingToSet {
  const char* name;  // "--cuda-graph-sizes"
  FlagValues values;
  bool refused;
  const char* why;   // the note, or the refusal's reason
};

// The table's flags given on the command line, with their values.
using GivenFlags = std::map<std::string, std::vector<std::string>>;

// Declares each flag of `table` in `group`; a given one lands in `given`.
void add_flags_with_nothing_to_set(CLI::Option_group* group, std::span<const FlagWithNothingToSet> table,
                                   GivenFlags& given);

// A note ("NAME VALUES: why") for each given flag; throws glms::Error with the same words for a
// refused one.
void check_flags_with_nothing_to_set(std::span<const FlagWithNothingToSet> table, const GivenFlags& given,
                                     std::vector<std::string>& notes);

// "NAME VALUES" as given.
std::string shown_as_given(const std::string& name, const GivenFlags& given);

}  // namespace glms::cli
