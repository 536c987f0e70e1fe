//===- SearchUtil.h - What the two searches share -------------------------===//
//
// Both searches (Search.cpp for transformers, OpSearch.cpp for any graph)
// pick the GPU kind that paces a uniform plan, enumerate the same batch
// splits around each data-parallel degree, and rank priced candidates the
// same way: CandidateRanking keeps the fastest that fits, the one with the
// least memory (for the "nothing fits" error), per parallel shape (dp, tp,
// pp, ...) the best that fits and the best of any, and the best topK + 1
// that fit. From those come the alternatives of the report: every shape
// whose best is faster but does not fit, the best of every other shape,
// then runners-up, ordered by the search's own ranking and cut to topK. A
// candidate type needs key(), time.total(), fits(), memory.total() and
// capacity; an alternative type is {cand, why}.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "planner/Cluster.h"
#include "planner/Search.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace dlopt::planner {

/// The divisors of `n` (n >= 1), ascending.
std::vector<int64_t> divisorsOf(int64_t n);

/// Whether `a` computes slower than `b` at `precision`: a lower peak, then
/// (equal peaks, e.g. H100 and H200) a lower memory bandwidth.
bool slowerGpu(const GpuSpec &a, const GpuSpec &b, Precision precision);

/// The slowest GPU kind (slowerGpu): it sets the pace of a uniform plan. An
/// error when its peak is not positive.
Expected<GpuSpec> pacingGpu(const Cluster &cluster, Precision precision);

/// The most constrained host of the cluster's node groups: the fewest CPU
/// cores and the least memory (0 where unknown).
HostSpec mostConstrainedHost(const Cluster &cluster);

/// Seconds one process spends issuing `launches` kernel launches under
/// `layout` on nodes of `gpusPerNode` GPUs and `host`: kernel_launch_us
/// each, times 1 + in_graph_launch_contention (G - 1) in-graph, times
/// max(1, G / cores) where the cores are known (docs/cost-model.md,
/// section 8).
double hostDispatchSeconds(double launches, ProcessLayout layout,
                           int gpusPerNode, const HostSpec &host,
                           const Calibration &cal);

/// The weight-gradient part of a backward pass of `backward` seconds whose
/// forward takes `forward`: a backward is `backwardFlopsRatio` forwards,
/// half of them weight gradients (the other half input gradients), so
/// forward x ratio / 2, at most the backward. Zero-bubble schedules defer
/// it (the bubble, the host drain and the simulator's W tasks).
inline double weightGradSeconds(double forward, double backward,
                                double backwardFlopsRatio) {
  return std::min(backward, forward * backwardFlopsRatio / 2);
}

/// Reasons joined by "; ".
std::string joinReasons(const std::vector<std::string> &why);

/// A micro-batch size and the number of micro-batches per step.
struct BatchSplit {
  int64_t mbs = 1, m = 1;
};
/// The splits of a global batch `globalBatch` over `dp` replicas: every
/// micro-batch size dividing the replica's share, honouring --fix dp, mbs
/// and mb and the size limit `maxMicroBatch` (0: none). Shapes skipped for
/// a reason are counted in `pruned`.
std::vector<BatchSplit> batchSplits(int dp, int64_t globalBatch,
                                    const FixSpec &fix, int64_t maxMicroBatch,
                                    std::map<std::string, int64_t> &pruned);

/// "no candidate plan<fixNote> for N devices and a global batch of B: every
/// candidate was pruned: <reason (count); ...>".
Status noCandidateError(const std::string &fixNote, int devices,
                        int64_t globalBatch,
                        const std::map<std::string, int64_t> &pruned);
/// "no plan fits in memory<fixNote>: the smallest peak found is X GiB per
/// device (<key>) against a capacity of Y GiB, over by Z GiB".
Status noFitError(const std::string &fixNote, double smallestPeak,
                  const std::string &key, double capacity);
/// "slower by 12.3%" and "out of memory by 4.20 GiB (5.0% faster)" against
/// the best plan's step time.
std::string slowerWhy(double time, double bestTime);
std::string outOfMemoryWhy(double memory, double capacity, double time,
                           double bestTime);

template <class Cand, class Shape, class Better> class CandidateRanking {
public:
  CandidateRanking(int topK, Better better) : topK_(topK), better_(better) {}

  struct Outcome {
    bool fits = false;    ///< within memory
    bool newBest = false; ///< the fastest fitting candidate so far
  };
  /// Records one priced candidate of parallel shape `shape`.
  Outcome consider(const Shape &shape, const Cand &cand) {
    ++priced_;
    keepBetter(shapeAny_, shape, cand);
    if (!leastMemory_ || cand.memory.total() < leastMemory_->memory.total())
      leastMemory_ = cand;
    Outcome out;
    if (!cand.fits()) {
      ++outOfMemory_;
      return out;
    }
    out.fits = true;
    ++feasible_;
    keepBetter(shapeFeasible_, shape, cand);
    if (!best_ || better_(cand, *best_)) {
      best_ = cand;
      out.newBest = true;
    }
    auto pos = std::lower_bound(top_.begin(), top_.end(), cand, better_);
    if (pos - top_.begin() <= topK_) {
      top_.insert(pos, cand);
      if (int(top_.size()) > topK_ + 1)
        top_.pop_back();
    }
    return out;
  }

  int64_t priced() const { return priced_; }
  int64_t feasible() const { return feasible_; }
  int64_t outOfMemory() const { return outOfMemory_; }
  const std::optional<Cand> &best() const { return best_; }
  const std::optional<Cand> &leastMemory() const { return leastMemory_; }

  /// The alternatives to `best` (normally best()): see the file comment.
  template <class Alt> std::vector<Alt> alternatives(const Cand &best) const {
    std::vector<Alt> alts;
    const double bt = best.time.total();
    std::set<std::string> seen{best.key()};
    for (const auto &[shape, any] : shapeAny_) {
      if (!any.fits() && better_(any, best)) {
        alts.push_back({any, outOfMemoryWhy(any.memory.total(), any.capacity,
                                            any.time.total(), bt)});
        seen.insert(any.key());
      }
      auto sf = shapeFeasible_.find(shape);
      if (sf != shapeFeasible_.end() && !seen.count(sf->second.key())) {
        alts.push_back({sf->second, slowerWhy(sf->second.time.total(), bt)});
        seen.insert(sf->second.key());
      }
    }
    for (const Cand &cand : top_)
      if (!seen.count(cand.key())) {
        alts.push_back({cand, slowerWhy(cand.time.total(), bt)});
        seen.insert(cand.key());
      }
    std::stable_sort(alts.begin(), alts.end(),
                     [&](const Alt &a, const Alt &b) {
                       return better_(a.cand, b.cand);
                     });
    if (int(alts.size()) > topK_)
      alts.resize(std::max(0, topK_));
    return alts;
  }

private:
  void keepBetter(std::map<Shape, Cand> &best, const Shape &shape,
                  const Cand &cand) const {
    auto it = best.find(shape);
    if (it == best.end())
      best.emplace(shape, cand);
    else if (better_(cand, it->second))
      it->second = cand;
  }

  int topK_;
  Better better_;
  int64_t priced_ = 0, feasible_ = 0, outOfMemory_ = 0;
  std::optional<Cand> best_, leastMemory_;
  std::map<Shape, Cand> shapeAny_, shapeFeasible_;
  std::vector<Cand> top_; ///< the best topK + 1 that fit, sorted
};

} // namespace dlopt::planner
