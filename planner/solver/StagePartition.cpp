//===- StagePartition.cpp - Balanced contiguous pipeline stages -----------===//
#include "planner/solver/ShardingSolver.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dlopt::planner {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
} // namespace

//===----------------------------------------------------------------------===//
// Stage partition
//===----------------------------------------------------------------------===//

std::vector<int> partitionStages(const std::vector<double> &times,
                                 int stages) {
  const int n = int(times.size());
  if (stages < 1 || n < stages)
    return {};
  std::vector<double> pre(n + 1, 0);
  for (int i = 0; i < n; ++i)
    pre[i + 1] = pre[i] + std::max(0.0, times[i]);
  // best[k][i]: the smallest maximum over k stages covering items [0, i).
  std::vector<std::vector<double>> best(stages + 1,
                                        std::vector<double>(n + 1, kInf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, 0));
  for (int i = 1; i <= n; ++i)
    best[1][i] = pre[i];
  for (int k = 2; k <= stages; ++k) {
    for (int i = k; i <= n; ++i) {
      // j in [k-1, i-1]: best[k-1][j] grows with j, pre[i]-pre[j] shrinks;
      // the optimum is where they cross.
      int lo = k - 1, hi = i - 1;
      while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (best[k - 1][mid] >= pre[i] - pre[mid])
          hi = mid;
        else
          lo = mid + 1;
      }
      int bj = lo;
      double bv = std::max(best[k - 1][lo], pre[i] - pre[lo]);
      if (lo - 1 >= k - 1) {
        double v = std::max(best[k - 1][lo - 1], pre[i] - pre[lo - 1]);
        if (v <= bv) {
          bv = v;
          bj = lo - 1;
        }
      }
      best[k][i] = bv;
      cut[k][i] = bj;
    }
  }
  std::vector<int> starts(stages + 1, 0);
  starts[stages] = n;
  int i = n;
  for (int k = stages; k >= 2; --k) {
    i = cut[k][i];
    starts[k - 1] = i;
  }
  starts[0] = 0;
  return starts;
}

} // namespace dlopt::planner
