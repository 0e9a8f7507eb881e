// Text and JSON for minidl_predict: one prediction as a breakdown table, or a ranked plan.
//
//   std::fputs(predict::format_prediction(p, machine).c_str(), stdout);
//   std::puts(predict::prediction_json(p, machine).c_str());
#pragma once

#include <string>
#include <vector>

#include "predict/machine.h"
#include "predict/predict.h"

namespace minidl::predict {

std::string format_prediction(const Prediction& p, const Machine& machine);
std::string prediction_json(const Prediction& p, const Machine& machine);

// The valid rows (at most `top`, fastest first), then the refused ones with their reasons (at most
// `refused_lines`, then a count of the rest by reason).
std::string format_plan(const std::vector<PlanRow>& rows, const Machine& machine, int top, int refused_lines);
std::string plan_json(const std::vector<PlanRow>& rows, const Machine& machine);

}  // namespace minidl::predict
