//===- FixSpec.cpp - The --fix grammar and candidate keys -----------------===//
#include "planner/Search.h"

#include "planner/SearchUtil.h"

#include <algorithm>
#include <cstdio>
#include <limits>

namespace dlopt::planner {

namespace {

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(sep, start);
    if (end == std::string_view::npos)
      end = s.size();
    out.emplace_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::optional<int64_t> parseInt(const std::string &s) {
  if (s.empty() || s.size() > 12)
    return std::nullopt;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9')
      return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

} // namespace

//===----------------------------------------------------------------------===//
// --fix
//===----------------------------------------------------------------------===//

std::optional<PipelineSchedule> parseSchedule(std::string_view s) {
  if (s == "gpipe")
    return PipelineSchedule::GPipe;
  if (s == "1f1b")
    return PipelineSchedule::OneFOneB;
  if (s == "interleaved" || s == "interleaved-1f1b")
    return PipelineSchedule::Interleaved1F1B;
  if (s == "zero-bubble" || s == "zb" || s == "zbh1")
    return PipelineSchedule::ZeroBubble;
  return std::nullopt;
}

std::optional<RecomputePolicy> parseRecompute(std::string_view s) {
  if (s == "none")
    return RecomputePolicy::None;
  if (s == "selective")
    return RecomputePolicy::Selective;
  if (s == "full")
    return RecomputePolicy::Full;
  if (s == "elementwise")
    return RecomputePolicy::Elementwise;
  if (s == "alternate")
    return RecomputePolicy::Alternate;
  return std::nullopt;
}

const char *layoutName(ProcessLayout l, int nodes) {
  if (l == ProcessLayout::BetweenGraph)
    return "between-graph";
  return nodes > 1 ? "hybrid" : "in-graph";
}

std::optional<ProcessLayout> parseLayout(std::string_view s) {
  if (s == "in-graph" || s == "hybrid")
    return ProcessLayout::InGraph;
  if (s == "between-graph")
    return ProcessLayout::BetweenGraph;
  return std::nullopt;
}

const char *scheduleKey(PipelineSchedule s) {
  // scheduleName's spelling, but "interleaved" for the interleaved 1F1B.
  return s == PipelineSchedule::Interleaved1F1B ? "interleaved"
                                                : scheduleName(s);
}


Expected<FixSpec> parseFix(std::string_view text) {
  FixSpec f;
  if (text.empty())
    return f;
  std::map<std::string, std::string> seen; // canonical key -> first item
  for (const std::string &item : split(text, ',')) {
    if (item.empty())
      continue;
    size_t eq = item.find('=');
    if (eq == std::string::npos)
      return Status::error("--fix: expected KEY=VALUE, got '" + item + "'");
    std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    std::string canon = k == "num_mb" ? "mb" : k;
    if (auto it = seen.find(canon); it != seen.end())
      return Status::error("--fix: " + canon + " is given twice ('" +
                           it->second + "' and '" + item + "')");
    seen[canon] = item;
    if (k == "schedule") {
      auto s = parseSchedule(v);
      if (!s)
        return Status::error("--fix: schedule '" + v +
                             "' is not one of gpipe, 1f1b, interleaved, "
                             "zero-bubble");
      f.schedule = s;
      continue;
    }
    if (k == "layout") {
      auto l = parseLayout(v);
      if (!l)
        return Status::error("--fix: layout '" + v +
                             "' is not one of in-graph, hybrid, "
                             "between-graph");
      f.layout = l;
      continue;
    }
    if (k == "sp") {
      if (v != "0" && v != "1")
        return Status::error("--fix: sp=" + v +
                             " is not 0 or 1 (sequence parallelism off/on)");
      f.sp = v == "1";
      continue;
    }
    if (k == "recompute") {
      auto r = parseRecompute(v);
      if (!r)
        return Status::error("--fix: recompute '" + v +
                             "' is not one of none, selective, "
                             "elementwise, alternate, full");
      f.recompute = r;
      continue;
    }
    static const char *known[] = {"dp", "tp", "pp", "cp", "v", "mbs", "mb",
                                  "num_mb", "zero"};
    if (std::find(std::begin(known), std::end(known), k) == std::end(known))
      return Status::error("--fix: unknown key '" + k +
                           "' (expected dp, tp, pp, cp, sp, mbs, mb, "
                           "schedule, v, zero, recompute, layout)");
    auto n = parseInt(v);
    if (!n || (*n < 1 && k != "zero") || *n > (int64_t(1) << 30))
      return Status::error("--fix: " + k + "=" + v +
                           " is not a positive integer");
    if ((k == "dp" || k == "tp" || k == "pp" || k == "cp" || k == "v") &&
        *n > kMaxDevices)
      return Status::error("--fix: " + k + "=" + v + " exceeds " +
                           std::to_string(kMaxDevices) +
                           ", the most devices a cluster may have");
    if (k == "dp")
      f.dp = int(*n);
    else if (k == "tp")
      f.tp = int(*n);
    else if (k == "pp")
      f.pp = int(*n);
    else if (k == "cp")
      f.cp = int(*n);
    else if (k == "v")
      f.v = int(*n);
    else if (k == "mbs")
      f.mbs = *n;
    else if (k == "mb" || k == "num_mb")
      f.numMicroBatches = *n;
    else if (k == "zero") {
      if (*n > 3)
        return Status::error("--fix: zero=" + v + " is not a ZeRO stage 0-3");
      f.zero = int(*n);
    } else
      return Status::error("--fix: unknown key '" + k +
                           "' (expected dp, tp, pp, cp, sp, mbs, mb, schedule, v, "
                           "zero, recompute, layout)");
  }
  if (f.v && *f.v > 1 && f.schedule &&
      *f.schedule != PipelineSchedule::Interleaved1F1B)
    return Status::error("--fix: v=" + std::to_string(*f.v) +
                         " (model chunks per stage) needs schedule="
                         "interleaved, not schedule=" +
                         scheduleKey(*f.schedule));
  if (f.v && *f.v == 1 && f.schedule &&
      *f.schedule == PipelineSchedule::Interleaved1F1B)
    return Status::error("--fix: schedule=interleaved needs v >= 2 model "
                         "chunks per stage, not v=1");
  if (f.v && *f.v > 1 && f.pp && *f.pp == 1)
    return Status::error("--fix: v=" + std::to_string(*f.v) +
                         " (model chunks per stage) needs a pipeline, "
                         "not pp=1");
  // v > 1 means the interleaved schedule: honour it as such.
  if (f.v && *f.v > 1)
    f.schedule = PipelineSchedule::Interleaved1F1B;
  return f;
}

static std::optional<int64_t>
checkedProduct(std::initializer_list<int64_t> factors) {
  int64_t p = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(p, f, &p))
      return std::nullopt;
  return p;
}

std::optional<int64_t> FixSpec::degreeProduct() const {
  return checkedProduct({dp.value_or(1), tp.value_or(1), pp.value_or(1),
                         cp.value_or(1)});
}

std::optional<int64_t> FixSpec::batchProduct() const {
  return checkedProduct(
      {dp.value_or(1), mbs.value_or(1), numMicroBatches.value_or(1)});
}

std::string FixSpec::str() const {
  std::string s;
  auto add = [&](const std::string &kv) { s += (s.empty() ? "" : ",") + kv; };
  if (dp) add("dp=" + std::to_string(*dp));
  if (tp) add("tp=" + std::to_string(*tp));
  if (pp) add("pp=" + std::to_string(*pp));
  if (cp) add("cp=" + std::to_string(*cp));
  if (sp) add(std::string("sp=") + (*sp ? "1" : "0"));
  if (mbs) add("mbs=" + std::to_string(*mbs));
  if (numMicroBatches) add("mb=" + std::to_string(*numMicroBatches));
  if (schedule) add(std::string("schedule=") + scheduleKey(*schedule));
  if (v) add("v=" + std::to_string(*v));
  if (zero) add("zero=" + std::to_string(*zero));
  if (recompute) add(std::string("recompute=") + recomputeName(*recompute));
  if (layout)
    add(std::string("layout=") +
        (*layout == ProcessLayout::InGraph ? "in-graph" : "between-graph"));
  return s;
}

std::string Candidate::key() const {
  std::string s = "dp=" + std::to_string(cfg.dp) + " tp=" +
                  std::to_string(cfg.tp) + " pp=" + std::to_string(cfg.pp);
  if (cfg.cp > 1)
    s += " cp=" + std::to_string(cfg.cp);
  if (cfg.sequenceParallel)
    s += " sp=1";
  s += " mbs=" + std::to_string(cfg.microBatchSize) + " mb=" +
                  std::to_string(cfg.numMicroBatches) + " schedule=" +
                  scheduleKey(cfg.schedule);
  if (cfg.schedule == PipelineSchedule::Interleaved1F1B)
    s += " v=" + std::to_string(cfg.virtualStages);
  s += " zero=" + std::to_string(cfg.zeroStage) +
       " recompute=" + recomputeName(cfg.recompute);
  if (!cfg.stageLayerCounts.empty()) {
    s += " split=";
    for (size_t i = 0; i < cfg.stageLayerCounts.size(); ++i) {
      if (i)
        s += '/';
      s += std::to_string(cfg.stageLayerCounts[i]);
    }
  }
  return s;
}

} // namespace dlopt::planner
