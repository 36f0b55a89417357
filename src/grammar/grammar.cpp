#include "grammar/grammar.h"

#include "grammar/stack_set.h"

namespace vesper::grammar {

bool Grammar::matches(std::string_view text) const {
  StackSet stacks = initial_stacks(*this);
  for (unsigned char c : text) {
    stacks = advance_stacks(*this, stacks, c);
    if (stacks.empty()) return false;
  }
  return is_accepting(stacks);
}

}  // namespace vesper::grammar
