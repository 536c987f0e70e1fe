//===- ConfigSpace.cpp - The configurations both searches price -----------===//
#include "planner/ConfigSpace.h"

#include "planner/SearchUtil.h"

#include <optional>
#include <utility>
#include <vector>

namespace dlopt::planner {

std::string unsupportedFixes(const SpaceRules &rules, const FixSpec &fix) {
  std::vector<std::string> why;
  if (!rules.contextParallel && fix.cp && *fix.cp > 1)
    why.push_back("cp=" + std::to_string(*fix.cp) +
                  ": context parallelism is planned for transformers with "
                  "layer marks only (dlopt-gen gpt/llama)");
  if (!rules.sequenceParallel && fix.sp && *fix.sp)
    why.push_back("sp=1: sequence parallelism is planned for transformers "
                  "with layer marks only (dlopt-gen gpt/llama)");
  if (!rules.recompute && fix.recompute &&
      *fix.recompute != RecomputePolicy::None)
    why.push_back(std::string("recompute=") + recomputeName(*fix.recompute) +
                  " is not available to op-level plans yet (none)");
  return joinReasons(why);
}

std::string explainShapeFix(const SpaceRules &r, const FixSpec &f) {
  auto str = [](int64_t v) { return std::to_string(v); };
  const int devices = r.devices;
  const int64_t gb = r.globalBatch, units = r.numUnits;
  std::vector<std::string> why;
  std::optional<int64_t> prodOr = f.degreeProduct();
  int64_t prod = prodOr.value_or(0);
  if (!prodOr)
    why.push_back("the fixed degrees multiply to more than 2^63, more than "
                  "the " +
                  str(devices) + " devices");
  else if (f.dp && f.tp && f.pp && prod != devices)
    why.push_back("dp*tp*pp*cp = " + str(*f.dp) + "*" + str(*f.tp) + "*" +
                  str(*f.pp) + "*" + str(f.cp.value_or(1)) + " = " + str(prod) +
                  " but the cluster has " + str(devices) + " devices");
  else if (devices % prod != 0)
    why.push_back("the fixed degrees multiply to " + str(prod) +
                  ", which does not divide the " + str(devices) + " devices");
  if (f.zero && *f.zero > 0 && f.dp && *f.dp == 1 && f.cp.value_or(1) == 1)
    why.push_back("zero=" + str(*f.zero) +
                  " shards over the data-parallel replicas (dp*cp), but dp=1 "
                  "and cp=1 leave nothing to shard over; use zero=0 or "
                  "dp >= 2");
  if (f.pp && *f.pp > units)
    why.push_back("pp=" + str(*f.pp) + " exceeds the " + str(units) + " " +
                  r.units);
  if (prodOr && !f.dp && f.tp && f.pp && devices % prod == 0 &&
      gb % (devices / prod))
    why.push_back("tp*pp*cp = " + str(prod) +
                  " leaves dp = " + str(devices / prod) +
                  ", which does not divide the global "
                  "batch " +
                  str(gb) + " (set --global-batch)");
  std::optional<int64_t> batchProdOr = f.batchProduct();
  int64_t batchProd = batchProdOr.value_or(0);
  if (!batchProdOr)
    why.push_back("the fixed dp/mbs/mb multiply to more than 2^63, more than "
                  "the global batch " +
                  str(gb));
  else if (f.dp && f.mbs && f.numMicroBatches && batchProd != gb)
    why.push_back("dp*mbs*mb = " + str(batchProd) +
                  " but the global batch is " + str(gb));
  else if (gb % batchProd)
    why.push_back("the fixed dp/mbs/mb multiply to " + str(batchProd) +
                  ", which does not divide the global batch " + str(gb) +
                  " (remainder " + str(gb % batchProd) + ")");
  if (f.schedule == PipelineSchedule::Interleaved1F1B) {
    int v = f.v.value_or(2);
    if (f.pp && *f.pp == 1)
      why.push_back("schedule=interleaved needs pp > 1");
    else if (f.pp && units < int64_t(*f.pp) * v)
      why.push_back("schedule=interleaved: pp*v = " + str(*f.pp * v) +
                    " model chunks exceed the " + str(units) + " " + r.units);
    else if (!f.pp && units < 2 * int64_t(v))
      why.push_back("schedule=interleaved: v=" + str(v) +
                    " model chunks per stage on at least 2 stages exceed "
                    "the " +
                    str(units) + " " + r.units);
    if (f.pp && *f.pp > 1 && f.numMicroBatches && *f.numMicroBatches % *f.pp)
      why.push_back("schedule=interleaved: mb=" + str(*f.numMicroBatches) +
                    " is not a multiple of pp=" + str(*f.pp));
  }
  return joinReasons(why);
}

void forEachConfig(const SpaceRules &r, const FixSpec &fix,
                   std::map<std::string, int64_t> &pruned,
                   const std::function<void(const TrainingConfig &)> &visit) {
  auto prune = [&](const std::string &why) { ++pruned[why]; };
  const std::string fewerUnits =
      "interleaved: fewer " + r.units + " than pp*v chunks, or mb % pp";
  for (int64_t tp64 : divisorsOf(r.devices)) {
    const int tp = int(tp64);
    if (fix.tp && *fix.tp != tp)
      continue;
    if (r.tpRule) {
      const std::string why = r.tpRule(tp);
      if (!why.empty()) {
        prune(why);
        continue;
      }
    }
    if (tp > r.gpusPerNode && !fix.tp) {
      prune("tp spans nodes (kept within a node)");
      continue;
    }
    for (int64_t cp64 : divisorsOf(r.devices / tp)) {
      const int cp = int(cp64);
      if (!r.contextParallel) {
        if (cp != 1)
          continue; // a fixed cp > 1 is refused (unsupportedFixes)
      } else if (fix.cp ? *fix.cp != cp : cp > 1 && r.seqLen < r.cpMinSeq) {
        if (!fix.cp)
          prune("cp > 1 (only searched for sequences of at least " +
                std::to_string(r.cpMinSeq) + " tokens)");
        continue;
      } else if (cp > 1 && r.seqLen % (2 * int64_t(cp))) {
        prune("2*cp does not divide the sequence");
        continue;
      } else if (cp > 1 && r.bytes.unfusedAttention) {
        prune("cp > 1 with unfused attention (ring attention runs fused "
              "kernels; no materialized-score form is priced)");
        continue;
      }
      for (int64_t pp64 : divisorsOf(r.devices / tp / cp)) {
        const int pp = int(pp64);
        if (fix.pp && *fix.pp != pp)
          continue;
        if (pp > r.numUnits) {
          prune("pp exceeds the " + r.units);
          continue;
        }
        const int dp = r.devices / tp / pp / cp;
        for (const auto [mbs, m] :
             batchSplits(dp, r.globalBatch, fix, r.maxMicroBatch, pruned)) {
          // Schedules, each with its model chunks per stage (v): only one
          // when there is no pipeline or no backward.
          std::vector<std::pair<PipelineSchedule, int>> scheds;
          auto interleaved = [&](int v) {
            if (r.numUnits < int64_t(pp) * v || m % pp) {
              prune(fewerUnits);
              return;
            }
            scheds.push_back({PipelineSchedule::Interleaved1F1B, v});
          };
          // A fixed v > 1 means interleaving (parseFix also sets the
          // schedule), a fixed v = 1 excludes it.
          const bool fixedInterleaved =
              fix.schedule == PipelineSchedule::Interleaved1F1B ||
              (fix.v && *fix.v > 1);
          if (pp == 1 || !r.training) {
            if (fixedInterleaved) {
              prune(pp == 1 ? "interleaved: needs pp > 1"
                            : "interleaved: a forward-only plan has no "
                              "backward to interleave");
              continue;
            }
            scheds.push_back({fix.schedule.value_or(
                                  r.training ? PipelineSchedule::OneFOneB
                                             : PipelineSchedule::GPipe),
                              1});
          } else if (!r.schedules) {
            const PipelineSchedule s = fix.schedule.value_or(
                fixedInterleaved ? PipelineSchedule::Interleaved1F1B
                                 : PipelineSchedule::OneFOneB);
            if (s == PipelineSchedule::Interleaved1F1B)
              interleaved(fix.v.value_or(2));
            else
              scheds.push_back({s, 1});
          } else {
            scheds.push_back({PipelineSchedule::GPipe, 1});
            scheds.push_back({PipelineSchedule::OneFOneB, 1});
            // Interleaving: every v >= 2 that splits the stage's units
            // into equal chunks (pp*v divides them); 2 and 4 with uneven
            // chunks when none does; a fixed v as given.
            std::vector<int> vs;
            if (fix.v) {
              if (*fix.v > 1)
                vs.push_back(*fix.v);
            } else {
              for (int64_t v = 2; v * pp <= r.numUnits; ++v)
                if (r.numUnits % (v * pp) == 0)
                  vs.push_back(int(v));
              if (vs.empty())
                vs = {2, 4};
            }
            for (int v : vs)
              interleaved(v);
            scheds.push_back({PipelineSchedule::ZeroBubble, 1});
          }
          for (auto [sched, v] : scheds) {
            if (fix.schedule && *fix.schedule != sched)
              continue;
            if (fix.v && (*fix.v > 1) !=
                             (sched == PipelineSchedule::Interleaved1F1B))
              continue;
            for (int zero = 0; zero <= 3; ++zero) {
              if (fix.zero && *fix.zero != zero)
                continue;
              if (!fix.zero && zero > 0 && (dp == 1 || !r.training))
                continue; // the same plan as zero=0
              if (zero > 0 && dp * cp == 1) {
                // A fixed stage with nothing to shard over, which
                // dlopt-compile refuses to apply.
                prune("zero > 0 with dp*cp = 1: no data-parallel replicas "
                      "to shard over");
                continue;
              }
              for (RecomputePolicy rc :
                   {RecomputePolicy::None, RecomputePolicy::Selective,
                    RecomputePolicy::Elementwise, RecomputePolicy::Alternate,
                    RecomputePolicy::Full}) {
                if (!r.recompute && rc != RecomputePolicy::None)
                  continue; // a fixed policy is refused (unsupportedFixes)
                if (fix.recompute && *fix.recompute != rc)
                  continue;
                if (!fix.recompute && !r.training &&
                    rc != RecomputePolicy::None)
                  continue;
                for (bool sp : {false, true}) {
                  if (sp && !r.sequenceParallel)
                    continue; // a fixed sp=1 is refused (unsupportedFixes)
                  if (fix.sp && *fix.sp != sp)
                    continue;
                  if (!fix.recompute && rc == RecomputePolicy::Selective &&
                      !sp && cp == 1 && !r.bytes.unfusedAttention) {
                    prune("recompute=selective without sp or cp: the same "
                          "plan as none (fused attention stores no scores to "
                          "re-run, nothing is gathered to gather again)");
                    continue;
                  }
                  if (sp && (tp == 1 || (r.seqLen / cp) % tp)) {
                    if (tp > 1)
                      prune("sp: tp does not divide the tokens per rank");
                    continue;
                  }
                  TrainingConfig cfg;
                  cfg.dp = dp;
                  cfg.tp = tp;
                  cfg.pp = pp;
                  cfg.cp = cp;
                  cfg.sequenceParallel = sp;
                  cfg.zeroStage = zero;
                  cfg.microBatchSize = mbs;
                  cfg.numMicroBatches = m;
                  cfg.schedule = sched;
                  cfg.virtualStages = v;
                  cfg.recompute = rc;
                  cfg.optimizer = r.optimizer;
                  cfg.precision = r.bytes;
                  visit(cfg);
                }
              }
            }
          }
        }
      }
    }
  }
}

} // namespace dlopt::planner
