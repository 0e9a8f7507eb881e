// MINIDL_TODO: what an exercise's skeleton holds where the solution had a region (scripts/minidl-exercise, and
// docs/exercises.md). A solution file in dist/naive/ marks each region to write:
//
//   // EXERCISE(ring): at step s send chunk r-s-1 to the right ...   (the hint: this comment block)
//   ...the solution...
//   // END EXERCISE
//
// and `minidl-exercise start ring` writes exercises/ring/ring.h with the region replaced by
//
//   // EXERCISE(ring)
//   MINIDL_TODO("at step s send chunk r-s-1 to the right ...");
//   // END EXERCISE
//
// which throws a minidl::NotImplementedError naming the exercise (the skeleton defines MINIDL_EXERCISE at its top),
// the function (__func__) and the hint, so a grader can say "not written yet" instead of "wrong".
#pragma once

#include <string>

#include "core/error.h"

namespace minidl {

class NotImplementedError : public Error {
 public:
  NotImplementedError(std::string exercise_name, std::string function_name, std::string hint_text)
      : Error(detail::concat("exercise ", exercise_name, ": ", function_name, " is not written yet (", hint_text, ")")),
        exercise(std::move(exercise_name)),
        function(std::move(function_name)),
        hint(std::move(hint_text)) {}
  std::string exercise, function, hint;
};

}  // namespace minidl

#define MINIDL_TODO(hint) throw ::minidl::NotImplementedError(MINIDL_EXERCISE, __func__, hint)
