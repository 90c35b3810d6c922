#include "cli/peer_flag_table.h"

#include <CLI/CLI.hpp>

#include "core/error.h"

namespace glms::cli {

void add_flags_with_nothing_to_set(CLI::Option_group* group, std::span<const FlagWithNothingToSet> table,
                                   GivenFlags& given) {
  for (const FlagWithNothingToSet& flag : table) {
    const std::string name = flag.name;
    const std::string help = std::string(flag.refused ? "Refused: " : "Accepted, no effect: ") + flag.why;
    if (flag.values == FlagValues::kNone) {
      group->add_flag_callback(name, [&given, name] { given[name] = {}; }, help);
      continue;
    }
    // One value leaves what follows (serve's model folder) to the command line.
    if (flag.values == FlagValues::kOne)
      group->add_option_function<std::string>(
          name, [&given, name](const std::string& value) { given[name] = {value}; }, help);
    else
      group
          ->add_option_function<std::vector<std::string>>(
              name, [&given, name](const std::vector<std::string>& values) { given[name] = values; }, help)
          ->expected(1, 64);
  }
}

std::string shown_as_given(const std::string& name, const GivenFlags& given) {
  std::string shown = name;
  const auto it = given.find(name);
  if (it != given.end())
    for (const std::string& value : it->second) shown += " " + value;
  return shown;
}

void check_flags_with_nothing_to_set(std::span<const FlagWithNothingToSet> table, const GivenFlags& given,
                                     std::vector<std::string>& notes) {
  for (const FlagWithNothingToSet& flag : table) {
    if (given.count(flag.name) == 0) continue;
    const std::string line = shown_as_given(flag.name, given) + ": " + flag.why;
    if (flag.refused) fail(line);
    notes.push_back(line);
  }
}

}  // namespace glms::cli
