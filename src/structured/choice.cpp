#include "structured/choice.h"

#include "core/error.h"
#include "structured/grammar.h"
#include "structured/recognizer.h"

namespace glms::structured {

std::shared_ptr<const Grammar> choice_grammar(const std::vector<std::string>& choices) {
  if (choices.empty()) fail("choice: give at least one string");
  std::vector<Expr> options;
  for (const std::string& c : choices) {
    if (c.empty()) fail("choice: the strings must not be empty");
    options.push_back(literal(c));
  }
  GrammarBuilder builder;
  builder.define("root", choice(std::move(options)));
  return builder.build("root", "choice");
}

std::shared_ptr<engine::TokenConstraint> make_choice_constraint(const std::vector<std::string>& choices,
                                                                TokenTexts texts) {
  return make_grammar_constraint(choice_grammar(choices), std::move(texts));
}

}  // namespace glms::structured
