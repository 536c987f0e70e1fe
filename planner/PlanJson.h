//===- PlanJson.h - The plan as a JSON value (internal) -------------------===//
//
// Internal to the planner: the dry-run reports write the plan file as this
// value plus a "report" object. Not a public header: it uses nlohmann/json.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "planner/Plan.h"
#include "planner/ReportUtil.h"

namespace dlopt::planner {

/// The plan-file document without the report (Plan::toJson's value).
report::json planJson(const Plan &plan);

} // namespace dlopt::planner
