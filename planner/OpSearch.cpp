//===- OpSearch.cpp - Strategy ILP, stage partition, op-level search ------===//
#include "planner/OpSearch.h"

#include "planner/PlanJson.h"
#include "planner/ReportUtil.h"
#include "planner/SearchUtil.h"

#ifdef DLOPT_HAVE_CBC
#include <coin/Cbc_C_Interface.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <tuple>

namespace dlopt::planner {

namespace {

using namespace report;

constexpr double kInf = std::numeric_limits<double>::infinity();

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

size_t numStrategies(const ShardingProblem::Node &n) { return n.cost.size(); }
double memOf(const ShardingProblem::Node &n, int k) {
  return n.mem.empty() ? 0.0 : n.mem[k];
}

} // namespace

//===----------------------------------------------------------------------===//
// The problem
//===----------------------------------------------------------------------===//

const char *solverName(SolverKind k) {
  switch (k) {
  case SolverKind::Auto:
    return "auto";
  case SolverKind::Ilp:
    return "ilp";
  case SolverKind::Greedy:
    return "greedy";
  case SolverKind::BruteForce:
    return "brute-force";
  }
  return "?";
}

bool haveIlpSolver() {
#ifdef DLOPT_HAVE_CBC
  return true;
#else
  return false;
#endif
}

double ShardingProblem::evaluate(const std::vector<int> &choice,
                                 double *mem) const {
  double c = 0, m = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    c += nodes[i].cost[choice[i]];
    m += memOf(nodes[i], choice[i]);
  }
  for (const Edge &e : edges)
    c += e.cost[size_t(choice[e.u]) * numStrategies(nodes[e.v]) + choice[e.v]];
  if (mem)
    *mem = m;
  return c;
}

Status ShardingProblem::validate() const {
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].cost.empty())
      return Status::error("sharding problem: node " + std::to_string(i) +
                           " has no strategy");
    if (!nodes[i].mem.empty() && nodes[i].mem.size() != nodes[i].cost.size())
      return Status::error("sharding problem: node " + std::to_string(i) +
                           " has " + std::to_string(nodes[i].mem.size()) +
                           " memory entries for " +
                           std::to_string(nodes[i].cost.size()) +
                           " strategies");
  }
  for (size_t j = 0; j < edges.size(); ++j) {
    const Edge &e = edges[j];
    if (e.u < 0 || e.v < 0 || e.u >= int(nodes.size()) ||
        e.v >= int(nodes.size()) || e.u == e.v)
      return Status::error("sharding problem: edge " + std::to_string(j) +
                           " has bad ends");
    if (e.cost.size() !=
        numStrategies(nodes[e.u]) * numStrategies(nodes[e.v]))
      return Status::error("sharding problem: edge " + std::to_string(j) +
                           " has a cost matrix of the wrong size");
  }
  return Status::ok();
}

//===----------------------------------------------------------------------===//
// Exact elimination (single strategies, separable edges, leaves, series)
//===----------------------------------------------------------------------===//

namespace {

/// A working copy of a problem whose nodes get eliminated one by one.
/// Without a memory budget, leaf and series eliminations are exact (the
/// classic series-parallel reduction: trees and series-parallel graphs
/// vanish entirely); with one, only single-strategy folding and separable
/// edges are removed (both exact for any objective).
class Eliminator {
public:
  explicit Eliminator(const ShardingProblem &p) {
    n_ = int(p.nodes.size());
    cost_.resize(n_);
    mem_.resize(n_);
    for (int i = 0; i < n_; ++i) {
      cost_[i] = p.nodes[i].cost;
      mem_[i] = p.nodes[i].mem.empty()
                    ? std::vector<double>(cost_[i].size(), 0.0)
                    : p.nodes[i].mem;
    }
    alive_.assign(n_, true);
    adj_.resize(n_);
    for (const auto &e : p.edges)
      addEdge(e.u, e.v, e.cost);
    constrained_ = p.constrained();
  }

  void run() {
    bool changed = true;
    while (changed) {
      changed = false;
      for (int v = 0; v < n_; ++v) {
        if (!alive_[v])
          continue;
        if (foldSeparable(v))
          changed = true;
        size_t k = cost_[v].size();
        size_t deg = adj_[v].size();
        if (k == 1) {
          eliminateFixed(v, 0);
          changed = true;
        } else if (constrained_) {
          continue;
        } else if (deg == 0) {
          int best = 0;
          for (size_t l = 1; l < k; ++l)
            if (cost_[v][l] < cost_[v][best])
              best = int(l);
          eliminateFixed(v, best);
          changed = true;
        } else if (deg == 1) {
          eliminateLeaf(v);
          changed = true;
        } else if (deg == 2) {
          eliminateSeries(v);
          changed = true;
        }
      }
    }
  }

  /// The nodes left, as a problem (node i of it is original coreIds()[i]).
  ShardingProblem core(double budget) const {
    ShardingProblem c;
    std::vector<int> index(n_, -1);
    for (int v = 0; v < n_; ++v)
      if (alive_[v]) {
        index[v] = int(c.nodes.size());
        c.nodes.push_back({cost_[v], mem_[v]});
      }
    for (const auto &[key, m] : edges_) {
      if (!alive_[key.first] || !alive_[key.second])
        continue;
      c.edges.push_back({index[key.first], index[key.second], m});
    }
    c.memBudget = budget - constMem_;
    return c;
  }
  std::vector<int> coreIds() const {
    std::vector<int> ids;
    for (int v = 0; v < n_; ++v)
      if (alive_[v])
        ids.push_back(v);
    return ids;
  }

  /// Fills in the eliminated nodes given the core's choices.
  std::vector<int> expand(const std::vector<int> &coreChoice) const {
    std::vector<int> choice(n_, 0);
    std::vector<int> ids = coreIds();
    for (size_t i = 0; i < ids.size(); ++i)
      choice[ids[i]] = coreChoice[i];
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      const Elim &e = *it;
      if (e.kind == Elim::Fixed)
        choice[e.v] = e.best[0];
      else if (e.kind == Elim::Leaf)
        choice[e.v] = e.best[choice[e.u]];
      else
        choice[e.v] = e.best[size_t(choice[e.u]) * e.kw + choice[e.w]];
    }
    return choice;
  }

private:
  struct Elim {
    enum Kind { Fixed, Leaf, Series } kind;
    int v, u = -1, w = -1;
    size_t kw = 0;
    std::vector<int> best;
  };

  /// Edge cost with `a` on the rows.
  double edge(int a, int ka, int b, int kb) const {
    if (a < b) {
      const auto &m = edges_.at({a, b});
      return m[size_t(ka) * cost_[b].size() + kb];
    }
    const auto &m = edges_.at({b, a});
    return m[size_t(kb) * cost_[a].size() + ka];
  }

  void addEdge(int a, int b, std::vector<double> m) {
    // Stored with the smaller index on the rows.
    if (a > b) {
      std::vector<double> t(m.size());
      size_t ka = cost_[a].size(), kb = cost_[b].size();
      for (size_t i = 0; i < ka; ++i)
        for (size_t j = 0; j < kb; ++j)
          t[j * ka + i] = m[i * kb + j];
      m.swap(t);
      std::swap(a, b);
    }
    auto it = edges_.find({a, b});
    if (it == edges_.end()) {
      edges_.emplace(std::make_pair(a, b), std::move(m));
      adj_[a].insert(b);
      adj_[b].insert(a);
    } else {
      for (size_t i = 0; i < m.size(); ++i)
        it->second[i] += m[i];
    }
  }

  void removeEdge(int a, int b) {
    edges_.erase({std::min(a, b), std::max(a, b)});
    adj_[a].erase(b);
    adj_[b].erase(a);
  }

  /// Edges whose cost is a_k + b_l go into the node costs.
  bool foldSeparable(int v) {
    bool any = false;
    std::vector<int> nbrs(adj_[v].begin(), adj_[v].end());
    for (int u : nbrs) {
      size_t kv = cost_[v].size(), ku = cost_[u].size();
      double scale = 0;
      for (size_t i = 0; i < kv; ++i)
        for (size_t j = 0; j < ku; ++j)
          scale = std::max(scale, std::abs(edge(v, int(i), u, int(j))));
      bool sep = true;
      for (size_t i = 0; i < kv && sep; ++i)
        for (size_t j = 0; j < ku && sep; ++j) {
          double r = edge(v, int(i), u, int(j)) - edge(v, int(i), u, 0) -
                     edge(v, 0, u, int(j)) + edge(v, 0, u, 0);
          sep = std::abs(r) <= 1e-12 * std::max(1.0, scale);
        }
      if (!sep)
        continue;
      double base = edge(v, 0, u, 0);
      std::vector<double> a(kv), b(ku);
      for (size_t i = 0; i < kv; ++i)
        a[i] = edge(v, int(i), u, 0);
      for (size_t j = 0; j < ku; ++j)
        b[j] = edge(v, 0, u, int(j)) - base;
      for (size_t i = 0; i < kv; ++i)
        cost_[v][i] += a[i];
      for (size_t j = 0; j < ku; ++j)
        cost_[u][j] += b[j];
      removeEdge(v, u);
      any = true;
    }
    return any;
  }

  void eliminateFixed(int v, int k) {
    for (int u : std::vector<int>(adj_[v].begin(), adj_[v].end())) {
      for (size_t j = 0; j < cost_[u].size(); ++j)
        cost_[u][j] += edge(u, int(j), v, k);
      removeEdge(u, v);
    }
    constMem_ += mem_[v][k];
    alive_[v] = false;
    order_.push_back({Elim::Fixed, v, -1, -1, 0, {k}});
  }

  void eliminateLeaf(int v) {
    int u = *adj_[v].begin();
    Elim e{Elim::Leaf, v, u, -1, 0, {}};
    for (size_t ku = 0; ku < cost_[u].size(); ++ku) {
      int best = 0;
      double bc = kInf;
      for (size_t l = 0; l < cost_[v].size(); ++l) {
        double c = cost_[v][l] + edge(u, int(ku), v, int(l));
        if (c < bc) {
          bc = c;
          best = int(l);
        }
      }
      cost_[u][ku] += bc;
      e.best.push_back(best);
    }
    removeEdge(u, v);
    alive_[v] = false;
    order_.push_back(std::move(e));
  }

  void eliminateSeries(int v) {
    auto it = adj_[v].begin();
    int u = *it++, w = *it;
    size_t ku = cost_[u].size(), kw = cost_[w].size();
    Elim e{Elim::Series, v, u, w, kw, {}};
    std::vector<double> m(ku * kw);
    for (size_t a = 0; a < ku; ++a)
      for (size_t b = 0; b < kw; ++b) {
        int best = 0;
        double bc = kInf;
        for (size_t l = 0; l < cost_[v].size(); ++l) {
          double c = cost_[v][l] + edge(u, int(a), v, int(l)) +
                     edge(v, int(l), w, int(b));
          if (c < bc) {
            bc = c;
            best = int(l);
          }
        }
        m[a * kw + b] = bc;
        e.best.push_back(best);
      }
    removeEdge(u, v);
    removeEdge(v, w);
    alive_[v] = false;
    addEdge(u, w, std::move(m));
    order_.push_back(std::move(e));
  }

  int n_ = 0;
  bool constrained_ = false;
  std::vector<std::vector<double>> cost_, mem_;
  std::vector<bool> alive_;
  std::vector<std::set<int>> adj_;
  std::map<std::pair<int, int>, std::vector<double>> edges_;
  std::vector<Elim> order_;
  double constMem_ = 0;
};

//===----------------------------------------------------------------------===//
// Greedy + local search, brute force, ILP
//===----------------------------------------------------------------------===//

struct Adjacency {
  /// Per node: (edge index, other end, this end is u).
  std::vector<std::vector<std::tuple<int, int, bool>>> of;
  explicit Adjacency(const ShardingProblem &p) : of(p.nodes.size()) {
    for (size_t j = 0; j < p.edges.size(); ++j) {
      of[p.edges[j].u].emplace_back(int(j), p.edges[j].v, true);
      of[p.edges[j].v].emplace_back(int(j), p.edges[j].u, false);
    }
  }
};

/// Cost of node v taking k given the others' choices (unchosen: -1 skip).
double localCost(const ShardingProblem &p, const Adjacency &adj,
                 const std::vector<int> &choice, int v, int k, double lambda) {
  double c = p.nodes[v].cost[k] + lambda * memOf(p.nodes[v], k);
  for (auto [j, o, isU] : adj.of[v]) {
    if (choice[o] < 0)
      continue;
    const auto &e = p.edges[j];
    size_t kv = numStrategies(p.nodes[e.v]);
    c += isU ? e.cost[size_t(k) * kv + choice[o]]
             : e.cost[size_t(choice[o]) * kv + k];
  }
  return c;
}

/// Greedy in node order, then sweeps of single-node moves until none
/// improves (memory as a penalty `lambda` per byte).
std::vector<int> greedy(const ShardingProblem &p, double lambda) {
  Adjacency adj(p);
  const int n = int(p.nodes.size());
  std::vector<int> choice(n, -1);
  for (int v = 0; v < n; ++v) {
    int best = 0;
    double bc = kInf;
    for (size_t k = 0; k < numStrategies(p.nodes[v]); ++k) {
      double c = localCost(p, adj, choice, v, int(k), lambda);
      if (c < bc) {
        bc = c;
        best = int(k);
      }
    }
    choice[v] = best;
  }
  for (int sweep = 0; sweep < 100; ++sweep) {
    bool improved = false;
    for (int v = 0; v < n; ++v) {
      double cur = localCost(p, adj, choice, v, choice[v], lambda);
      for (size_t k = 0; k < numStrategies(p.nodes[v]); ++k) {
        double c = localCost(p, adj, choice, v, int(k), lambda);
        if (c < cur - 1e-15 * std::max(1.0, std::abs(cur))) {
          cur = c;
          choice[v] = int(k);
          improved = true;
        }
      }
    }
    if (!improved)
      break;
  }
  return choice;
}

Expected<std::vector<int>> bruteForce(const ShardingProblem &p,
                                      int64_t maxCombos, bool *feasible) {
  double combos = 1;
  for (const auto &n : p.nodes)
    combos *= double(numStrategies(n));
  if (combos > double(maxCombos))
    return Status::error("brute force: " + strf("%.3g", combos) +
                         " assignments exceed the limit of " +
                         std::to_string(maxCombos));
  const int n = int(p.nodes.size());
  std::vector<int> cur(n, 0), best;
  double bestCost = kInf, bestMem = kInf;
  bool bestFeasible = false;
  while (true) {
    double mem = 0;
    double c = p.evaluate(cur, &mem);
    bool ok = mem <= p.memBudget;
    // Feasible beats infeasible; among infeasible the least memory.
    if (best.empty() || (ok && (!bestFeasible || c < bestCost)) ||
        (!ok && !bestFeasible && mem < bestMem)) {
      best = cur;
      bestCost = c;
      bestMem = mem;
      bestFeasible = ok;
    }
    int i = n - 1;
    while (i >= 0 && ++cur[i] == int(numStrategies(p.nodes[i]))) {
      cur[i] = 0;
      --i;
    }
    if (i < 0)
      break;
  }
  if (n == 0)
    best.clear();
  *feasible = bestFeasible || n == 0;
  return best;
}

struct IlpOutcome {
  std::vector<int> choice;
  bool optimal = false, infeasible = false, solved = false;
  int64_t vars = 0, rows = 0;
  double seconds = 0;
  std::string note;
};

/// The one-hot product formulation (Alpa): binary s[v][k], continuous
/// e[uv][k][l] in [0, 1] with sum_l e = s[u][k] and sum_k e = s[v][l], so
/// e = s[u][k] * s[v][l] at integer points; minimize sum c s + sum E e with
/// sum mem s <= budget. Costs are scaled to microseconds, memory to the
/// budget.
IlpOutcome solveIlp(const ShardingProblem &p, double timeLimit,
                    int64_t maxNodes, const std::vector<int> &start) {
  IlpOutcome out;
#ifndef DLOPT_HAVE_CBC
  (void)p;
  (void)timeLimit;
  (void)maxNodes;
  (void)start;
  out.note = "built without CBC";
  return out;
#else
  auto t0 = Clock::now();
  const double kScale = 1e6;
  const int n = int(p.nodes.size());
  Cbc_Model *model = Cbc_newModel();
  Cbc_setLogLevel(model, 0);
  Cbc_setProblemName(model, "dlopt_sharding");
  std::vector<int> sBase(n);
  int col = 0;
  for (int v = 0; v < n; ++v) {
    sBase[v] = col;
    for (size_t k = 0; k < numStrategies(p.nodes[v]); ++k, ++col)
      Cbc_addCol(model, "", 0, 1, p.nodes[v].cost[k] * kScale, 1, 0, nullptr,
                 nullptr);
  }
  std::vector<int> idx;
  std::vector<double> val;
  int rows = 0;
  for (int v = 0; v < n; ++v) {
    idx.clear();
    val.clear();
    for (size_t k = 0; k < numStrategies(p.nodes[v]); ++k) {
      idx.push_back(sBase[v] + int(k));
      val.push_back(1);
    }
    Cbc_addRow(model, "", int(idx.size()), idx.data(), val.data(), 'E', 1);
    ++rows;
  }
  for (const auto &e : p.edges) {
    size_t ku = numStrategies(p.nodes[e.u]), kv = numStrategies(p.nodes[e.v]);
    int eBase = col;
    for (size_t a = 0; a < ku; ++a)
      for (size_t b = 0; b < kv; ++b, ++col)
        Cbc_addCol(model, "", 0, 1, e.cost[a * kv + b] * kScale, 0, 0, nullptr,
                   nullptr);
    // Marginals: the pair variables of strategy `k` at one end sum to that
    // end's strategy variable (`stride` steps over the other end's).
    auto marginal = [&](int node, size_t k, size_t first, size_t count,
                        size_t stride) {
      idx.clear();
      val.clear();
      for (size_t i = 0; i < count; ++i) {
        idx.push_back(eBase + int(first + i * stride));
        val.push_back(1);
      }
      idx.push_back(sBase[node] + int(k));
      val.push_back(-1);
      Cbc_addRow(model, "", int(idx.size()), idx.data(), val.data(), 'E', 0);
      ++rows;
    };
    for (size_t a = 0; a < ku; ++a)
      marginal(e.u, a, a * kv, kv, 1);
    for (size_t b = 0; b < kv; ++b)
      marginal(e.v, b, b, ku, kv);
  }
  if (p.constrained()) {
    // In units of the budget, so that the row is well scaled for any unit.
    double unit = p.memBudget > 0 ? p.memBudget : 1.0;
    idx.clear();
    val.clear();
    for (int v = 0; v < n; ++v)
      for (size_t k = 0; k < numStrategies(p.nodes[v]); ++k) {
        idx.push_back(sBase[v] + int(k));
        val.push_back(memOf(p.nodes[v], int(k)) / unit);
      }
    Cbc_addRow(model, "", int(idx.size()), idx.data(), val.data(), 'L',
               p.memBudget / unit);
    ++rows;
  }
  out.vars = col;
  out.rows = rows;
  Cbc_setObjSense(model, 1);
  Cbc_setMaximumSeconds(model, timeLimit);
  if (maxNodes > 0)
    Cbc_setMaximumNodes(model, int(std::min<int64_t>(maxNodes, 1 << 30)));
  Cbc_setParameter(model, "threads", "1");
  if (int(start.size()) == n) {
    std::vector<int> ci;
    std::vector<double> cv;
    for (int v = 0; v < n; ++v) {
      ci.push_back(sBase[v] + start[v]);
      cv.push_back(1);
    }
    Cbc_setMIPStartI(model, int(ci.size()), ci.data(), cv.data());
  }
  Cbc_solve(model);
  out.infeasible = Cbc_isProvenInfeasible(model);
  out.optimal = Cbc_isProvenOptimal(model);
  const double *x = Cbc_bestSolution(model);
  if (!x && !out.infeasible)
    x = Cbc_getColSolution(model);
  if (x && !out.infeasible) {
    out.solved = true;
    out.choice.assign(n, 0);
    for (int v = 0; v < n; ++v) {
      double bv = -1;
      for (size_t k = 0; k < numStrategies(p.nodes[v]); ++k)
        if (x[sBase[v] + k] > bv + 1e-9) {
          bv = x[sBase[v] + k];
          out.choice[v] = int(k);
        }
    }
  }
  if (Cbc_isSecondsLimitReached(model))
    out.note = strf("the ILP stopped at its %.0f s time limit", timeLimit);
  else if (Cbc_isNodeLimitReached(model))
    out.note = "the ILP stopped at its limit of " + std::to_string(maxNodes) +
               " branch-and-bound nodes";
  Cbc_deleteModel(model);
  out.seconds = since(t0);
  return out;
#endif
}

/// Solves a problem without elimination: the ILP if possible (better of it
/// and greedy when not proven optimal), else greedy with a Lagrangian memory
/// penalty.
SolveResult solveCore(const ShardingProblem &p, const SolveOptions &o,
                      bool allowIlp, const std::vector<int> *start) {
  SolveResult r;
  r.coreNodes = int(p.nodes.size());
  if (p.nodes.empty()) {
    r.optimal = true;
    r.method = "elimination";
    return r;
  }
  // Greedy start (penalized until it fits when there is a budget), unless
  // the caller has one.
  std::vector<int> g =
      start && start->size() == p.nodes.size() ? *start : greedy(p, 0);
  double gm = 0;
  double gc = p.evaluate(g, &gm);
  if (!start && p.constrained() && gm > p.memBudget) {
    double lo = 0, hi = 1e-15;
    std::vector<int> fit;
    while (hi < 1e6) {
      auto c = greedy(p, hi);
      double m = 0;
      p.evaluate(c, &m);
      if (m <= p.memBudget) {
        fit = c;
        break;
      }
      lo = hi;
      hi *= 4;
    }
    if (!fit.empty()) {
      for (int it = 0; it < 40; ++it) {
        double mid = 0.5 * (lo + hi);
        auto c = greedy(p, mid);
        double m = 0;
        p.evaluate(c, &m);
        if (m <= p.memBudget) {
          hi = mid;
          fit = c;
        } else {
          lo = mid;
        }
      }
      g = fit;
    } else {
      g = greedy(p, 1e6); // least memory found
    }
    gc = p.evaluate(g, &gm);
  }
  r.choice = g;
  r.cost = gc;
  r.mem = gm;
  r.method = "greedy";

  int64_t vars = 0;
  for (const auto &n : p.nodes)
    vars += int64_t(numStrategies(n));
  for (const auto &e : p.edges)
    vars += int64_t(e.cost.size());
  if (!allowIlp)
    return r;
  if (!haveIlpSolver()) {
    r.note = "CBC is not available: greedy with local search";
    return r;
  }
  if (vars > o.maxIlpVars) {
    r.note = "the ILP would have " + std::to_string(vars) +
             " variables (limit " + std::to_string(o.maxIlpVars) +
             "): greedy with local search";
    return r;
  }
  IlpOutcome ilp = solveIlp(p, o.timeLimit, o.maxNodes, g);
  r.ilpVars = ilp.vars;
  r.ilpRows = ilp.rows;
  r.ilpSeconds = ilp.seconds;
  if (!ilp.solved) {
    r.note = ilp.infeasible ? "the ILP is infeasible within the memory budget"
                            : "the ILP found no solution" +
                                  (ilp.note.empty() ? "" : ": " + ilp.note);
    return r;
  }
  double im = 0;
  double ic = p.evaluate(ilp.choice, &im);
  bool ilpOk = !p.constrained() || im <= p.memBudget * (1 + 1e-9);
  bool greedyOk = !p.constrained() || gm <= p.memBudget;
  if (ilpOk && (ilp.optimal || !greedyOk || ic <= gc)) {
    r.choice = ilp.choice;
    r.cost = ic;
    r.mem = im;
    r.method = "ilp (cbc)";
    r.optimal = ilp.optimal;
  }
  if (!ilp.optimal)
    r.note = ilp.note.empty() ? "the ILP was not proven optimal" : ilp.note;
  return r;
}

} // namespace

namespace {

/// Exact elimination, then the core (the ILP when allowed, else greedy).
/// Exact when the core is empty or the ILP proves optimality. A budget is
/// ignored unless `keepBudget` (then only eliminations exact under it run).
SolveResult eliminateAndSolve(const ShardingProblem &p, const SolveOptions &o,
                              bool allowIlp,
                              const std::vector<int> *start = nullptr) {
  Eliminator el(p);
  el.run();
  ShardingProblem core = el.core(p.memBudget);
  std::vector<int> coreStart;
  if (start) {
    for (int id : el.coreIds())
      coreStart.push_back((*start)[id]);
  }
  SolveResult cr = solveCore(core, o, allowIlp, start ? &coreStart : nullptr);
  SolveResult r = cr;
  r.choice = el.expand(cr.choice);
  if (core.nodes.empty()) {
    r.method = "elimination";
    r.optimal = true;
  } else {
    r.method = "elimination + " + cr.method;
  }
  return r;
}

/// Memory as a price: for a multiplier lambda the problem min cost + lambda
/// * mem has no budget, so exact elimination solves it; bisection on lambda
/// finds the cheapest assignment within the budget among those solutions.
/// Not proven optimal when the budget binds (the ILP polish may improve it).
SolveResult lagrangian(const ShardingProblem &p, const SolveOptions &o) {
  ShardingProblem q = p;
  q.memBudget = kInf;
  auto at = [&](double lambda) {
    for (size_t i = 0; i < p.nodes.size(); ++i)
      for (size_t k = 0; k < p.nodes[i].cost.size(); ++k)
        q.nodes[i].cost[k] =
            p.nodes[i].cost[k] + lambda * memOf(p.nodes[i], int(k));
    // The core of a graph that is not series-parallel gets greedy here; the
    // final polish runs the ILP on the real problem.
    SolveResult r = eliminateAndSolve(q, o, false);
    r.cost = p.evaluate(r.choice, &r.mem);
    r.feasible = r.mem <= p.memBudget;
    return r;
  };
  SolveResult r0 = at(0);
  if (r0.feasible)
    return r0; // the unconstrained optimum fits: optimal for the budget too
  std::optional<SolveResult> best;
  SolveResult least = r0;
  auto consider = [&](const SolveResult &r) {
    if (r.feasible && (!best || r.cost < best->cost))
      best = r;
    if (r.mem < least.mem)
      least = r;
  };
  double lo = 0, hi = 1e-18;
  bool found = false;
  for (int i = 0; i < 40; ++i, hi *= 10) {
    SolveResult r = at(hi);
    consider(r);
    if (r.feasible) {
      found = true;
      break;
    }
    lo = hi;
  }
  if (found) {
    for (int i = 0; i < 30; ++i) {
      double mid = lo > 0 ? std::sqrt(lo * hi) : hi / 10;
      SolveResult r = at(mid);
      consider(r);
      if (r.feasible)
        hi = mid;
      else
        lo = mid;
    }
  }
  SolveResult r = best ? *best : least;
  r.optimal = false;
  r.method = "lagrangian + " + r.method;
  if (!best)
    r.note = "no assignment found within the memory budget";
  return r;
}

} // namespace

Expected<SolveResult> solveSharding(const ShardingProblem &p,
                                    const SolveOptions &o) {
  DLOPT_RETURN_IF_ERROR(p.validate());
  SolveResult r;
  if (o.kind == SolverKind::BruteForce) {
    bool feasible = true;
    auto c = bruteForce(p, o.maxBruteForce, &feasible);
    if (!c)
      return c.status();
    r.choice = *c;
    r.optimal = true;
    r.method = "brute force";
  } else if (o.kind == SolverKind::Ilp) {
    r = solveCore(p, o, true, nullptr);
    r.coreNodes = int(p.nodes.size());
    r.method = r.method == "ilp (cbc)" ? "ilp (cbc, no elimination)"
                                       : r.method;
  } else if (!p.constrained()) {
    r = eliminateAndSolve(p, o, o.kind == SolverKind::Auto);
  } else {
    r = lagrangian(p, o);
    if (o.kind == SolverKind::Auto && o.polish && !r.optimal) {
      // The ILP with the memory row, started from the Lagrangian solution.
      SolveResult il =
          eliminateAndSolve(p, o, true, r.choice.empty() ? nullptr : &r.choice);
      double mem = 0;
      double cost = p.evaluate(il.choice, &mem);
      bool ok = mem <= p.memBudget * (1 + 1e-9);
      bool rOk = r.mem <= p.memBudget * (1 + 1e-9);
      if (ok && (!rOk || cost <= r.cost || il.optimal)) {
        il.method = "lagrangian + " + il.method;
        r = il;
      } else {
        r.ilpVars = il.ilpVars;
        r.ilpRows = il.ilpRows;
        r.ilpSeconds = il.ilpSeconds;
        r.note = il.note;
      }
    }
  }
  if (p.nodes.empty())
    r.choice.clear();
  r.cost = p.evaluate(r.choice, &r.mem);
  r.feasible = !p.constrained() || r.mem <= p.memBudget * (1 + 1e-9);
  if (!r.feasible)
    r.optimal = false;
  return r;
}

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

//===----------------------------------------------------------------------===//
// The search
//===----------------------------------------------------------------------===//

std::string OpCandidate::key() const {
  return "dp=" + std::to_string(cfg.dp) + " tp=" + std::to_string(cfg.tp) +
         " pp=" + std::to_string(cfg.pp) +
         " mbs=" + std::to_string(cfg.microBatchSize) +
         " mb=" + std::to_string(cfg.numMicroBatches) +
         " zero=" + std::to_string(cfg.zeroStage);
}

namespace {

/// Memory weights for the constrained ILP of one (pp, zero).
struct MemWeights {
  double paramPerElem = 0; ///< bytes per parameter element on a device
  double activation = 0;   ///< factor on per-micro-batch activation bytes
  double budget = kInf;
};

/// A solved strategy problem for one (tp, dp, mbs) and what it costs per op.
struct Solved {
  int t = 1, dp = 1;
  int64_t mbs = 1, m = 1;
  GraphGeometry geo;
  std::vector<std::vector<Strategy>> strategies; ///< per op id
  std::vector<std::vector<Layout>> argLayouts;   ///< per arg (params)
  std::vector<int> nodeOfOp, nodeOfArg;
  ShardingProblem problem;
  SolveResult solve;
  // Derived from the choice, per op id:
  std::vector<int> chosen;          ///< strategy index (-1: not a node)
  std::vector<double> compute;      ///< per micro-batch (fwd + bwd)
  std::vector<double> mbComm;       ///< per micro-batch
  std::vector<double> stepComm;     ///< per step (parameter gradients)
  std::vector<double> activation;   ///< stored bytes per micro-batch
  std::vector<double> workingSet;   ///< bytes of one op's operands + result
  std::vector<Layout> resultLayout; ///< per op id
  std::vector<Layout> paramLayout;  ///< per arg
  std::vector<std::vector<int>> paramsOf; ///< per op id: param args it uses
  bool constrained = false;
  MemWeights weights; ///< when constrained

  Solved(const GraphSummary &g, int64_t microBatch, double floatBytes)
      : geo(g, microBatch, floatBytes) {}
};

/// The fraction of the parameters' elements that the backward pass reads
/// (ZeRO-3 gathers those again there; the others only in the forward
/// pass): a parameter is read by the backward pass when an op that is not
/// linear in each operand separately (matmul, mul, a norm, a convolution,
/// ...) uses it beside an operand that needs a gradient (one that depends
/// on a parameter). A first layer's weight (its input is data), a bias
/// (an add) and an untied embedding table (a gather) are not.
double backwardReadFraction(const GraphSummary &g) {
  std::vector<bool> dependsOnParam(g.ops.size(), false);
  std::vector<bool> read(g.args.size(), false);
  auto isParam = [&](const ValueRef &r) {
    return r.isArg() && r.argIndex() < int(g.args.size()) &&
           g.args[r.argIndex()].role == ArgNode::Role::Param;
  };
  auto depends = [&](const ValueRef &r) {
    if (r.isArg())
      return isParam(r);
    return r.producer >= 0 && r.producer < int(g.ops.size()) &&
           dependsOnParam[r.producer];
  };
  for (const OpNode &n : g.ops) {
    if (n.backward)
      continue;
    bool any = false;
    for (const ValueRef &r : n.operands)
      any = any || depends(r);
    if (n.id >= 0 && n.id < int(g.ops.size()))
      dependsOnParam[n.id] = any && n.isFloat;
    bool linearInEach =
        n.op == "dlopt.add" || n.op == "dlopt.sub" || n.op == "dlopt.neg" ||
        n.op == "dlopt.cast" || n.kind == OpClass::Reshape ||
        n.kind == OpClass::Transpose || n.kind == OpClass::Broadcast ||
        n.kind == OpClass::Gather || n.kind == OpClass::Concat ||
        n.kind == OpClass::Slice || n.kind == OpClass::Constant;
    if (linearInEach)
      continue;
    for (size_t i = 0; i < n.operands.size(); ++i) {
      if (!isParam(n.operands[i]))
        continue;
      for (size_t j = 0; j < n.operands.size(); ++j)
        if (j != i && depends(n.operands[j]))
          read[n.operands[i].argIndex()] = true;
    }
  }
  double all = 0, bwd = 0;
  for (size_t k = 0; k < g.args.size(); ++k) {
    if (g.args[k].role != ArgNode::Role::Param)
      continue;
    double e = 1;
    for (int64_t d : g.args[k].shape)
      e *= double(d);
    all += e;
    if (read[k])
      bwd += e;
  }
  return all > 0 ? bwd / all : 1.0;
}

struct Ctx {
  const GraphSummary &g;
  const Cluster &cluster;
  const CostModel &cost;
  const SearchOptions &opt;
  CommPricer pricer;
  GpuSpec gpu{};
  double capacity = 0;
  bool train = true;
  double ratio = 2;
  double floatBytes = 4;
  std::vector<int> fwdOps; ///< non-backward op ids in order
  SolveOptions solveOptions{};
  OpSearchStats *stats = nullptr;
  /// backwardReadFraction(g): what ZeRO-3 gathers again for the backward.
  double bwdReadFraction = 1;

  double roofline(OpKind kind, double flops, double bytes) const {
    if (flops <= 0 && bytes <= 0)
      return 0;
    OpCost op{kind, opt.precision, std::max(0.0, flops), std::max(0.0, bytes)};
    auto e = cost.computeTime(op, gpu);
    return e ? e->time : 0;
  }
};

double opBytes(const Solved &s, const OpNode &op) {
  double b = s.geo.result(op.id).bytes;
  for (size_t i = 0; i < op.operands.size(); ++i)
    b += s.geo.operand(op.id, int(i)).bytes;
  // Results past #0 (batch-norm running stats, ...): their own size.
  double r0 = double(op.elemBytes);
  for (int64_t d : op.shape)
    r0 *= double(d);
  b += std::max(0.0, op.resultBytes - r0);
  return b;
}

double stateBytesPerElem(const SearchOptions &opt, bool train) {
  const PrecisionConfig &pr = opt.bytes;
  if (!train)
    return pr.paramBytes;
  int moments = opt.optimizer == Optimizer::Adam       ? 2
                : opt.optimizer == Optimizer::Momentum ? 1
                                                       : 0;
  return pr.paramBytes + pr.gradBytes + moments * pr.optimizerStateBytes +
         (pr.masterWeights ? pr.masterBytes : 0.0);
}

/// One optimizer step over `elems` parameters: a memory-bound elementwise
/// pass reading and writing every state.
double optimizerTime(const Ctx &c, double elems) {
  return c.roofline(OpKind::Elementwise, 10 * elems,
                    2 * elems * stateBytesPerElem(c.opt, true));
}

/// Builds and solves the strategy problem of (t, dp, mbs).
std::unique_ptr<Solved> solveFor(Ctx &c, int t, int dp, int64_t mbs,
                                 int64_t m, const MemWeights *mw) {
  const GraphSummary &g = c.g;
  auto s = std::make_unique<Solved>(g, mbs, c.floatBytes);
  s->t = t;
  s->dp = dp;
  s->mbs = mbs;
  s->m = m;
  s->constrained = mw != nullptr;
  if (mw)
    s->weights = *mw;
  const size_t nOps = g.ops.size(), nArgs = g.args.size();
  s->strategies.resize(nOps);
  s->argLayouts.resize(nArgs);
  s->nodeOfOp.assign(nOps, -1);
  s->nodeOfArg.assign(nArgs, -1);
  const double mm = double(m);
  ShardingProblem &p = s->problem;
  const bool train = c.train;

  // Params used by forward ops are nodes (their layout over t).
  std::vector<bool> used(nArgs, false);
  for (int id : c.fwdOps)
    for (const ValueRef &r : g.ops[id].operands)
      if (r.isArg() && r.argIndex() < int(nArgs))
        used[r.argIndex()] = true;
  for (size_t a = 0; a < nArgs; ++a) {
    if (!used[a] || g.args[a].role != ArgNode::Role::Param)
      continue;
    s->argLayouts[a] = paramLayouts(g.args[a].shape, t);
    double elems = 1;
    for (int64_t d : g.args[a].shape)
      elems *= double(d);
    ShardingProblem::Node n;
    for (const Layout &l : s->argLayouts[a]) {
      double div = l.kind == Layout::S ? t : 1;
      double sync = 0;
      if (train && dp > 1)
        sync = c.pricer.time(Collective::AllReduce,
                             elems / div * c.opt.bytes.gradReduceBytes, dp, t);
      // The optimizer updates what the device holds; without training, a
      // tie-breaker of 0.1 ns per GB held keeps weights sharded when that
      // is free.
      double update = train ? optimizerTime(c, elems / div)
                            : 1e-19 * elems / div * c.opt.bytes.paramBytes;
      n.cost.push_back(sync + update);
      n.mem.push_back(mw ? elems / div * mw->paramPerElem : 0.0);
    }
    s->nodeOfArg[a] = int(p.nodes.size());
    p.nodes.push_back(std::move(n));
  }

  // Forward ops (constants are free values, like inputs).
  for (int id : c.fwdOps) {
    const OpNode &op = g.ops[id];
    if (op.kind == OpClass::Constant)
      continue;
    s->strategies[id] = shardingRules(s->geo, id, t);
    const double scale = s->geo.scale(id);
    const double flops = op.flops * scale;
    const double bytes = opBytes(*s, op);
    const OpKind kind = rooflineKind(op);
    ShardingProblem::Node n;
    for (const Strategy &st : s->strategies[id]) {
      double fwd = c.roofline(kind, flops / st.divisor, bytes / st.divisor);
      double comp = train ? fwd * (1 + c.ratio) : fwd;
      double comm = 0;
      for (const IntrinsicComm &ic : st.comms)
        if (train || !ic.backward)
          comm += c.pricer.time(ic.collective, ic.bytes, t, 1);
      n.cost.push_back(mm * (comp + comm));
      double act = 0;
      if (train && op.isFloat)
        act = s->geo.result(id).bytes /
              (st.result.kind == Layout::S ? double(t) : 1.0);
      n.mem.push_back(mw ? act * mw->activation : 0.0);
    }
    s->nodeOfOp[id] = int(p.nodes.size());
    p.nodes.push_back(std::move(n));
  }

  // Edges: producer layout x consumer strategy.
  for (int id : c.fwdOps) {
    int v = s->nodeOfOp[id];
    if (v < 0)
      continue;
    const OpNode &op = g.ops[id];
    const auto &sv = s->strategies[id];
    for (size_t i = 0; i < op.operands.size(); ++i) {
      const ValueRef &ref = op.operands[i];
      int u = -1;
      std::vector<Layout> from;
      bool isParam = false;
      if (ref.isArg()) {
        if (ref.argIndex() >= int(nArgs) || s->nodeOfArg[ref.argIndex()] < 0)
          continue;
        u = s->nodeOfArg[ref.argIndex()];
        from = s->argLayouts[ref.argIndex()];
        isParam = true;
      } else {
        if (ref.producer < 0 || ref.result != 0 ||
            s->nodeOfOp[ref.producer] < 0)
          continue;
        u = s->nodeOfOp[ref.producer];
        for (const Strategy &ps : s->strategies[ref.producer])
          from.push_back(ps.result);
      }
      const ValueInfo &val = s->geo.operand(id, int(i));
      const bool grad = train && val.needsGrad;
      ShardingProblem::Edge e;
      e.u = u;
      e.v = v;
      bool any = false;
      for (const Layout &lu : from)
        for (const Strategy &st : sv) {
          const Layout req = st.operands[i];
          double fwd = c.pricer.time(reshard(lu, req, val.bytes, t), t);
          double bwd = 0;
          if (grad)
            bwd = c.pricer.time(reshard(gradLayout(req, st.divisor),
                                        gradNeed(lu), val.bytes, t),
                                t);
          double cost = mm * fwd + (isParam ? 1.0 : mm) * bwd;
          any |= cost != 0;
          e.cost.push_back(cost);
        }
      if (any)
        p.edges.push_back(std::move(e));
    }
  }
  if (mw)
    p.memBudget = mw->budget;

  auto solved = solveSharding(p, c.solveOptions);
  if (solved) {
    s->solve = *solved;
  } else {
    // Only malformed problems fail; fall back to all-replicated.
    s->solve.choice.assign(p.nodes.size(), 0);
    s->solve.note = solved.status().message();
  }
  if (c.stats) {
    ++c.stats->solves;
    if (s->solve.ilpVars > 0)
      ++c.stats->ilpSolves;
    c.stats->maxCoreNodes =
        std::max<int64_t>(c.stats->maxCoreNodes, s->solve.coreNodes);
    c.stats->maxIlpVars = std::max(c.stats->maxIlpVars, s->solve.ilpVars);
    c.stats->maxIlpRows = std::max(c.stats->maxIlpRows, s->solve.ilpRows);
    c.stats->ilpSeconds += s->solve.ilpSeconds;
    if (!s->solve.note.empty()) {
      std::string note = "tp=" + std::to_string(t) + " dp=" +
                         std::to_string(dp) + " mbs=" + std::to_string(mbs) +
                         (mw ? " (memory-constrained)" : "") + ": " +
                         s->solve.note;
      if (c.stats->notes.size() < 8)
        c.stats->notes.push_back(note);
    }
  }

  // Per-op costs of the choice.
  const auto &ch = s->solve.choice;
  s->chosen.assign(nOps, -1);
  s->compute.assign(nOps, 0);
  s->mbComm.assign(nOps, 0);
  s->stepComm.assign(nOps, 0);
  s->activation.assign(nOps, 0);
  s->workingSet.assign(nOps, 0);
  s->resultLayout.assign(nOps, Layout::rep());
  s->paramLayout.assign(nArgs, Layout::rep());
  s->paramsOf.assign(nOps, {});
  for (size_t a = 0; a < nArgs; ++a)
    if (s->nodeOfArg[a] >= 0)
      s->paramLayout[a] = s->argLayouts[a][ch[s->nodeOfArg[a]]];
  for (int id : c.fwdOps)
    if (s->nodeOfOp[id] >= 0) {
      s->chosen[id] = ch[s->nodeOfOp[id]];
      s->resultLayout[id] = s->strategies[id][s->chosen[id]].result;
    }
  for (int id : c.fwdOps) {
    const OpNode &op = g.ops[id];
    for (const ValueRef &r : op.operands)
      if (r.isArg() && r.argIndex() < int(nArgs) &&
          s->nodeOfArg[r.argIndex()] >= 0)
        s->paramsOf[id].push_back(r.argIndex());
    if (s->chosen[id] < 0)
      continue;
    const Strategy &st = s->strategies[id][s->chosen[id]];
    double flops = op.flops * s->geo.scale(id);
    double bytes = opBytes(*s, op);
    double fwd = c.roofline(rooflineKind(op), flops / st.divisor,
                            bytes / st.divisor);
    s->compute[id] = train ? fwd * (1 + c.ratio) : fwd;
    for (const IntrinsicComm &ic : st.comms)
      if (train || !ic.backward)
        s->mbComm[id] += c.pricer.time(ic.collective, ic.bytes, t, 1);
    double work = s->geo.result(id).bytes /
                  (st.result.kind == Layout::S ? double(t) : 1.0);
    if (train && op.isFloat)
      s->activation[id] = work;
    for (size_t i = 0; i < op.operands.size(); ++i) {
      const ValueRef &ref = op.operands[i];
      const ValueInfo &val = s->geo.operand(id, int(i));
      const Layout req = st.operands[i];
      work += val.bytes / (req.kind == Layout::S ? double(t) : 1.0);
      Layout lu;
      bool isParam = false;
      if (ref.isArg()) {
        if (ref.argIndex() >= int(nArgs) || s->nodeOfArg[ref.argIndex()] < 0)
          continue;
        lu = s->paramLayout[ref.argIndex()];
        isParam = true;
      } else {
        if (ref.producer < 0 || ref.result != 0 ||
            s->chosen[ref.producer] < 0)
          continue;
        lu = s->resultLayout[ref.producer];
      }
      s->mbComm[id] += c.pricer.time(reshard(lu, req, val.bytes, t), t);
      if (train && val.needsGrad) {
        double b = c.pricer.time(
            reshard(gradLayout(req, st.divisor), gradNeed(lu), val.bytes, t),
            t);
        (isParam ? s->stepComm[id] : s->mbComm[id]) += b;
      }
    }
    s->workingSet[id] = work;
  }
  return s;
}

struct Priced {
  OpCandidate cand;
  std::vector<int> starts; ///< stage starts over units
  std::vector<int> unitStart; ///< unit -> first index into fwdOps
  bool byLayer = false;
};

/// Units of the partition: runs of equal layer marks when the graph has
/// marks and enough of them, else single ops. Returns start positions in
/// fwdOps (plus the end).
std::vector<int> makeUnits(const Ctx &c, int pp, bool *byLayer) {
  const auto &ops = c.fwdOps;
  bool marks = false;
  for (int id : ops)
    marks |= c.g.ops[id].layer >= 0;
  std::vector<int> starts;
  if (marks) {
    for (size_t i = 0; i < ops.size(); ++i)
      if (i == 0 || c.g.ops[ops[i]].layer != c.g.ops[ops[i - 1]].layer)
        starts.push_back(int(i));
    if (int(starts.size()) >= pp) {
      starts.push_back(int(ops.size()));
      *byLayer = true;
      return starts;
    }
  }
  starts.clear();
  for (size_t i = 0; i <= ops.size(); ++i)
    starts.push_back(int(i));
  *byLayer = false;
  return starts;
}

/// Model chunks per stage: v for the interleaved schedule, else 1.
int chunksPerStage(const TrainingConfig &cfg, bool train) {
  return train && cfg.schedule == PipelineSchedule::Interleaved1F1B
             ? std::max(1, cfg.virtualStages)
             : 1;
}

/// Prices one candidate from a solved strategy problem. `stageOps` gets each
/// stage's range of positions in fwdOps when given.
Priced price(Ctx &c, const Solved &s, TrainingConfig cfg) {
  Priced out;
  OpCandidate &cand = out.cand;
  cand.cfg = cfg;
  cand.capacity = c.capacity;
  cand.memoryConstrained = s.constrained;
  const Calibration &cal = c.cost.calibration();
  const bool train = c.train;
  const int pp = cfg.pp, t = cfg.tp, dp = cfg.dp;
  const double m = double(cfg.numMicroBatches);

  // Interleaved, the ops are cut into pp * v model chunks, chunk k on
  // stage k % pp.
  const int V = chunksPerStage(cfg, train);
  const int chunks = pp * V;
  out.unitStart = makeUnits(c, chunks, &out.byLayer);
  const int nUnits = int(out.unitStart.size()) - 1;
  std::vector<double> unitTime(nUnits, 0);
  for (int u = 0; u < nUnits; ++u)
    for (int i = out.unitStart[u]; i < out.unitStart[u + 1]; ++i) {
      int id = c.fwdOps[i];
      unitTime[u] += s.compute[id] + s.mbComm[id];
    }
  out.starts = partitionStages(unitTime, chunks);
  if (out.starts.empty()) {
    cand.memory.workspace = kInf;
    cand.time.compute = kInf;
    return out;
  }
  // Stage (and chunk) of each forward op position.
  std::vector<int> stageOfPos(c.fwdOps.size(), 0);
  std::vector<int> stageOfOp(c.g.ops.size(), -1), chunkOfOp(c.g.ops.size(), -1);
  for (int ch = 0; ch < chunks; ++ch)
    for (int u = out.starts[ch]; u < out.starts[ch + 1]; ++u)
      for (int i = out.unitStart[u]; i < out.unitStart[u + 1]; ++i) {
        stageOfPos[i] = ch % pp;
        stageOfOp[c.fwdOps[i]] = ch % pp;
        chunkOfOp[c.fwdOps[i]] = ch;
      }

  struct StageSum {
    double compute = 0, comm = 0, step = 0, act = 0, work = 0;
    double paramElems = 0, largestParam = 0;
    std::set<int> params;
  };
  std::vector<StageSum> ss(pp);
  for (size_t i = 0; i < c.fwdOps.size(); ++i) {
    int id = c.fwdOps[i];
    StageSum &x = ss[stageOfPos[i]];
    x.compute += s.compute[id];
    x.comm += s.mbComm[id];
    x.step += s.stepComm[id];
    x.act += s.activation[id];
    x.work = std::max(x.work, s.workingSet[id]);
    for (int a : s.paramsOf[id])
      x.params.insert(a);
  }
  for (StageSum &x : ss)
    for (int a : x.params) {
      double e = 1;
      for (int64_t d : c.g.args[a].shape)
        e *= double(d);
      e /= s.paramLayout[a].kind == Layout::S ? double(t) : 1.0;
      x.paramElems += e;
      x.largestParam = std::max(x.largestParam, e);
    }

  // Bytes crossing each chunk boundary per micro-batch (per rank): chunk
  // k sends to chunk k + 1, from stage k % pp to (k + 1) % pp.
  std::vector<double> boundary(std::max(0, chunks - 1), 0);
  if (pp > 1) {
    std::vector<int> lastUse(c.g.ops.size(), -1);
    for (int id : c.fwdOps)
      for (const ValueRef &r : c.g.ops[id].operands)
        if (!r.isArg() && r.producer >= 0 && chunkOfOp[r.producer] >= 0)
          lastUse[r.producer] = std::max(lastUse[r.producer], chunkOfOp[id]);
    for (int id : c.fwdOps) {
      if (lastUse[id] <= chunkOfOp[id] || c.g.ops[id].kind == OpClass::Constant)
        continue;
      double b = s.geo.result(id).bytes /
                 (s.resultLayout[id].kind == Layout::S ? double(t) : 1.0);
      for (int ch = chunkOfOp[id]; ch < lastUse[id]; ++ch)
        boundary[ch] += b;
    }
  }

  int w = 0;
  for (int st = 1; st < pp; ++st)
    if (ss[st].compute + ss[st].comm > ss[w].compute + ss[w].comm)
      w = st;
  const double perMb = ss[w].compute + ss[w].comm;
  StepTime &T = cand.time;
  T.compute = m * ss[w].compute;
  if (train) {
    double update = 0;
    for (const StageSum &x : ss)
      update = std::max(update, optimizerTime(c, x.paramElems));
    T.compute += update;
  }
  double step = 0;
  for (const StageSum &x : ss)
    step = std::max(step, x.step);
  T.tpComm = m * ss[w].comm + step;
  if (pp > 1) {
    T.bubble = (pp - 1) * perMb / V;
    if (train && cfg.schedule == PipelineSchedule::ZeroBubble) {
      // ZB-H1, as the transformer search prices it (docs/cost-model.md):
      // the deferred weight-gradient passes (half the backward) fill the
      // cooldown, down to (pp-1) max(t_F, t_B).
      double fwd = ss[w].compute / (1 + c.ratio);
      double weightGrad = fwd * c.ratio / 2;
      double inputGrad = std::max(0.0, perMb - fwd - weightGrad);
      T.bubble = (pp - 1) * std::max(perMb - 2 * weightGrad,
                                     std::max(fwd, inputGrad));
    }
    // Each stage sends over the boundaries of its chunks (and, backward,
    // their gradients back), overlapped with its micro-batch's compute.
    double worst = 0;
    for (int st = 0; st < pp; ++st) {
      double sends = 0;
      for (int ch = st; ch < chunks - 1; ch += pp)
        sends += c.pricer.time(Collective::SendRecv, boundary[ch], 2, t * dp);
      worst = std::max(worst, m * c.cost.exposedP2P((train ? 2 : 1) * sends,
                                                    perMb));
    }
    T.ppComm = worst;
  }
  if (train && dp > 1) {
    double worst = 0;
    for (const StageSum &x : ss) {
      double grads = x.paramElems * cfg.precision.gradBytes;
      double params = x.paramElems * cfg.precision.paramBytes;
      double backward = x.compute * c.ratio / (1 + c.ratio);
      double e = 0;
      if (cfg.zeroStage == 0) {
        e = c.cost.exposedGradSync(
            c.pricer.time(Collective::AllReduce, grads, dp, t), backward);
      } else {
        // ZeRO >= 2 keeps no whole gradient: each micro-batch's is
        // reduce-scattered as its backward pass makes it.
        e = (cfg.zeroStage >= 2 ? m : 1.0) *
            c.cost.exposedGradSync(
                c.pricer.time(Collective::ReduceScatter, grads, dp, t), backward);
        double ag = c.pricer.time(Collective::AllGather, params, dp, t);
        double agBwd = c.pricer.time(Collective::AllGather,
                                     params * c.bwdReadFraction, dp, t);
        e += cfg.zeroStage < 3
                 ? ag
                 : m * CostModel::exposed(ag + agBwd, x.compute + x.comm,
                                          cal.gradOverlapEfficiency);
      }
      worst = std::max(worst, e);
    }
    T.dpComm = worst;
  }

  // Memory: the largest stage.
  MemoryBreakdown peak;
  double peakTotal = -1;
  for (int st = 0; st < pp; ++st) {
    const StageSum &x = ss[st];
    MemoryBreakdown mb;
    mb.stage = st;
    if (train) {
      auto states = stateMemory(x.paramElems, dp, cfg.zeroStage,
                                cfg.optimizer, cfg.precision);
      if (states) {
        mb.params = states->params;
        mb.grads = states->grads;
        mb.optimizer = states->optimizer;
      }
      mb.activations = x.act * microBatchesInFlight(cfg, st);
    } else {
      mb.params = x.paramElems * cfg.precision.paramBytes;
      // Live values of a forward pass: bounded by twice the largest op.
      mb.activations = 0;
    }
    mb.transient = x.work * (train ? 1.0 : 2.0);
    int comms = (t > 1) + (dp > 1 && train) + (pp > 1);
    mb.commBuffers = comms * cal.ncclBufferBytes;
    if (pp > 1) {
      // The largest activation this stage sends or receives.
      double largest = 0;
      for (int ch = 0; ch + 1 < chunks; ++ch)
        if (ch % pp == st || (ch + 1) % pp == st)
          largest = std::max(largest, boundary[ch]);
      mb.commBuffers += 2 * largest;
    }
    if (train && dp > 1 && cfg.zeroStage < 3)
      mb.commBuffers += 2 * cal.gradBucketBytes;
    if (train && dp > 1 && cfg.zeroStage == 3)
      mb.commBuffers += 2 * x.largestParam * cfg.precision.paramBytes;
    mb.workspace = cal.runtimeReservedBytes +
                   cal.fragmentationFraction *
                       (mb.activations + mb.transient + mb.commBuffers);
    if (mb.total() > peakTotal) {
      peakTotal = mb.total();
      peak = mb;
    }
  }
  cand.memory = peak;
  return out;
}

bool better(const OpCandidate &a, const OpCandidate &b) {
  double ta = a.time.total(), tb = b.time.total();
  if (ta != tb)
    return ta < tb;
  auto k = [](const OpCandidate &c) {
    return std::make_tuple(c.cfg.tp, c.cfg.pp, c.cfg.dp, c.cfg.microBatchSize,
                           c.cfg.zeroStage, int(c.cfg.schedule));
  };
  return k(a) < k(b);
}

std::string fixedIssues(const FixSpec &f) {
  std::vector<std::string> why;
  if (f.v && (!f.schedule || *f.schedule != PipelineSchedule::Interleaved1F1B))
    why.push_back("v= needs schedule=interleaved");
  if (f.recompute && *f.recompute != RecomputePolicy::None)
    why.push_back(std::string("recompute=") + recomputeName(*f.recompute) +
                  " is not available to op-level plans yet (none)");
  return joinReasons(why);
}

SolverKind solverFromEnv() {
  const char *e = std::getenv("DLOPT_OP_SOLVER");
  if (!e)
    return SolverKind::Auto;
  std::string s = e;
  if (s == "ilp")
    return SolverKind::Ilp;
  if (s == "greedy")
    return SolverKind::Greedy;
  return SolverKind::Auto;
}

} // namespace

OpGraphParts splitOpGraph(const GraphSummary &g) {
  OpGraphParts parts;
  // A graph that is already a training step (dlopt-compile --train --emit
  // mlir) has backward ops (dlopt.backward) and, after them, the optimizer
  // update: the update is priced as the optimizer step, not planned per op.
  bool seenBackward = false;
  for (const OpNode &op : g.ops) {
    if (op.backward) {
      parts.backwardFlops += op.flops;
      ++parts.numBackward;
      // (Constants are hoisted to the top by canonicalization.)
      seenBackward |= op.kind != OpClass::Constant;
    } else if (seenBackward) {
      ++parts.numUpdate;
    } else {
      parts.forwardFlops += op.flops;
      parts.forward.push_back(op.id);
    }
  }
  return parts;
}

Expected<OpPlanResult> searchOpPlan(const GraphSummary &g,
                                    const Cluster &cluster,
                                    const CostModel &cost,
                                    const SearchOptions &opt) {
  auto t0 = Clock::now();
  DLOPT_RETURN_IF_ERROR(cluster.validate());
  DLOPT_RETURN_IF_ERROR(validateSearchOptions(opt));
  OpPlanResult res;
  OpSearchStats &st = res.stats;
  Ctx c{g, cluster, cost, opt, CommPricer(cluster, cost), {}, 0, true, 2, 4,
        {}, {}, nullptr};
  c.stats = &st;
  c.bwdReadFraction = backwardReadFraction(g);
  c.train = opt.training;
  c.floatBytes = opt.bytes.activationBytes;
  c.capacity = cluster.minDeviceMemory();
  c.solveOptions.kind = solverFromEnv();
  // Memory-constrained problems get the Lagrangian search while enumerating;
  // the ILP polishes the chosen plan only.
  c.solveOptions.polish = false;
  auto gpu = pacingGpu(cluster, opt.precision);
  if (!gpu)
    return gpu.status();
  c.gpu = *gpu;
  std::string fixWhy = fixedIssues(opt.fix);
  if (!fixWhy.empty())
    return Status::error("--fix " + opt.fix.str() + " is impossible: " +
                         fixWhy);

  const OpGraphParts parts = splitOpGraph(g);
  const double fwdFlops = parts.forwardFlops, bwdFlops = parts.backwardFlops;
  c.fwdOps = parts.forward;
  res.numBackwardOps = parts.numBackward;
  res.numUpdateOps = parts.numUpdate;
  res.numForwardOps = int(c.fwdOps.size());
  if (c.fwdOps.empty())
    return Status::error("the entry function @" + g.modelName +
                         " has no ops to plan");
  c.ratio = cost.calibration().backwardFlopsRatio;
  if (res.numBackwardOps > 0 && fwdFlops > 0) {
    c.ratio = bwdFlops / fwdFlops;
    res.backwardFromGraph = true;
  }
  res.backwardRatio = c.ratio;

  const int devices = cluster.numDevices();
  const int64_t B = g.batch > 0 ? g.batch : 1;
  const int64_t gb = opt.globalBatch > 0 ? opt.globalBatch : B;
  if (gb < 1)
    return Status::error("the global batch must be at least 1");
  const FixSpec &fix = opt.fix;
  const int gpusPerNode =
      cluster.groups.empty() ? 1 : cluster.groups.front().gpusPerNode;
  const PipelineSchedule sched = fix.schedule.value_or(
      c.train ? PipelineSchedule::OneFOneB : PipelineSchedule::GPipe);

  std::map<std::tuple<int, int, int64_t>, std::unique_ptr<Solved>> cache;
  std::map<std::tuple<int, int, int64_t, int, int>, std::unique_ptr<Solved>>
      memCache;
  CandidateRanking<OpCandidate, std::tuple<int, int, int>, decltype(&better)>
      ranking(opt.topK, &better);
  const Solved *bestSolved = nullptr;
  auto prune = [&](const std::string &why) { ++st.pruned[why]; };
  int constrainedSolves = 0;
  const int kMaxConstrainedSolves = 48;

  auto consider = [&](const OpCandidate &cand, const Solved *s) {
    auto out = ranking.consider({cand.cfg.dp, cand.cfg.tp, cand.cfg.pp}, cand);
    if (out.newBest)
      bestSolved = s;
    return out.fits;
  };

  for (int64_t t64 : divisorsOf(devices)) {
    int t = int(t64);
    if (fix.tp && *fix.tp != t)
      continue;
    if (!fix.tp && t > gpusPerNode) {
      prune("tp spans nodes (kept within a node)");
      continue;
    }
    for (int64_t pp64 : divisorsOf(devices / t)) {
      int pp = int(pp64);
      if (fix.pp && *fix.pp != pp)
        continue;
      const int v = sched == PipelineSchedule::Interleaved1F1B
                        ? int(fix.v.value_or(2))
                        : 1;
      if (pp * v > int(c.fwdOps.size())) {
        prune("pp (times v) exceeds the ops");
        continue;
      }
      if (v > 1 && pp == 1) {
        prune("schedule=interleaved needs pp > 1");
        continue;
      }
      if (v > 1 && !c.train) {
        prune("schedule=interleaved needs a training step");
        continue;
      }
      int dp = devices / t / pp;
      for (const auto [mbs, m] :
           batchSplits(dp, gb, fix, opt.maxMicroBatch, st.pruned)) {
        auto key = std::make_tuple(t, dp, mbs);
        auto it = cache.find(key);
        if (it == cache.end())
          it = cache.emplace(key, solveFor(c, t, dp, mbs, m, nullptr)).first;
        const Solved &s = *it->second;
        std::vector<int> zeros{0};
        if (c.train && dp > 1)
          zeros = {0, 1, 2, 3};
        for (int zero : zeros) {
          if (fix.zero && *fix.zero != zero)
            continue;
          TrainingConfig cfg;
          cfg.dp = dp;
          cfg.tp = t;
          cfg.pp = pp;
          cfg.zeroStage = zero;
          cfg.microBatchSize = mbs;
          cfg.numMicroBatches = m;
          cfg.schedule = sched;
          cfg.virtualStages = v;
          cfg.optimizer = opt.optimizer;
          cfg.precision = opt.bytes;
          Priced pr = price(c, s, cfg);
          if (consider(pr.cand, &s) || t == 1)
            continue;
          // Out of memory: let the ILP trade time for memory.
          if (constrainedSolves >= kMaxConstrainedSolves) {
            if (st.notes.size() < 8 &&
                std::find(st.notes.begin(), st.notes.end(),
                          "memory-constrained solves stopped at " +
                              std::to_string(kMaxConstrainedSolves)) ==
                    st.notes.end())
              st.notes.push_back("memory-constrained solves stopped at " +
                                 std::to_string(kMaxConstrainedSolves));
            continue;
          }
          const Calibration &cal = cost.calibration();
          MemWeights mw;
          double inflight =
              c.train ? microBatchesInFlight(cfg, 0) : 0.0;
          mw.paramPerElem = stateBytesPerElem(opt, c.train) / pp;
          if (c.train && dp > 1) {
            auto one = stateMemory(1.0, dp, zero, opt.optimizer, opt.bytes);
            if (one)
              mw.paramPerElem = one->total() / pp;
          }
          mw.activation =
              inflight / pp * (1 + cal.fragmentationFraction);
          double fixed = pr.cand.memory.commBuffers +
                         pr.cand.memory.transient +
                         cal.runtimeReservedBytes;
          mw.budget = c.capacity - fixed;
          if (mw.budget <= 0)
            continue;
          auto mkey = std::make_tuple(t, dp, mbs, pp, zero);
          auto mit = memCache.find(mkey);
          if (mit == memCache.end()) {
            ++constrainedSolves;
            mit = memCache
                      .emplace(mkey, solveFor(c, t, dp, mbs, m, &mw))
                      .first;
          }
          Priced pc = price(c, *mit->second, cfg);
          consider(pc.cand, mit->second.get());
        }
      }
    }
  }

  st.priced = ranking.priced();
  st.feasible = ranking.feasible();
  st.outOfMemory = ranking.outOfMemory();
  std::string fixNote = fix.empty() ? "" : " with --fix " + fix.str();
  if (st.priced == 0)
    return noCandidateError(fixNote, devices, gb, st.pruned);
  if (!ranking.best()) {
    const OpCandidate &lm = *ranking.leastMemory();
    return noFitError(fixNote, lm.memory.total(), lm.key(), lm.capacity);
  }
  std::optional<OpCandidate> best = ranking.best();

  // Alternatives, as in the transformer search.
  res.alternatives = ranking.alternatives<OpAlternative>(*best);

  std::unique_ptr<Solved> polished;
  if (bestSolved->constrained && c.solveOptions.kind == SolverKind::Auto) {
    c.solveOptions.polish = true;
    const TrainingConfig &bc = best->cfg;
    polished = solveFor(c, bc.tp, bc.dp, bc.microBatchSize, bc.numMicroBatches,
                        &bestSolved->weights);
    Priced pp = price(c, *polished, bc);
    if (pp.cand.fits() && pp.cand.time.total() <= best->time.total()) {
      best = pp.cand;
      bestSolved = polished.get();
    }
  }

  // The chosen plan in detail.
  const Solved &s = *bestSolved;
  Priced pr = price(c, s, best->cfg);
  res.best = pr.cand;
  res.solve = s.solve;
  st.problemNodes = int64_t(s.problem.nodes.size());
  st.problemEdges = int64_t(s.problem.edges.size());
  res.stagesByLayer = pr.byLayer;
  const int t = best->cfg.tp, dp = best->cfg.dp, pp = best->cfg.pp;
  const double m = double(best->cfg.numMicroBatches);
  for (int id : c.fwdOps) {
    OpChoice ch;
    ch.op = id;
    if (s.chosen[id] >= 0) {
      const Strategy &sg = s.strategies[id][s.chosen[id]];
      ch.strategy = sg.name;
      ch.operands = sg.operands;
      ch.result = sg.result;
    } else {
      ch.strategy = "replicated";
      ch.operands.assign(g.ops[id].operands.size(), Layout::rep());
    }
    ch.time = s.compute[id] + s.mbComm[id];
    res.choices.push_back(std::move(ch));
  }
  for (size_t a = 0; a < g.args.size(); ++a)
    if (s.nodeOfArg[a] >= 0)
      res.params.emplace_back(g.args[a].name, s.paramLayout[a]);

  // Reshardings and intrinsic collectives of the chosen plan.
  auto producerName = [&](const ValueRef &r) {
    if (r.isArg())
      return "param " + (r.argIndex() < int(g.args.size())
                             ? g.args[r.argIndex()].name
                             : std::to_string(r.argIndex()));
    return "#" + std::to_string(r.producer) + " " + g.ops[r.producer].op;
  };
  double tpTotal = 0;
  for (int id : c.fwdOps) {
    if (s.chosen[id] < 0)
      continue;
    const OpNode &op = g.ops[id];
    const Strategy &sg = s.strategies[id][s.chosen[id]];
    for (const IntrinsicComm &ic : sg.comms) {
      if (!c.train && ic.backward)
        continue;
      ReshardOp r;
      r.consumer = id;
      r.what = ic.what;
      r.backward = ic.backward;
      r.collective = ic.collective;
      r.groupSize = t;
      r.bytes = ic.bytes;
      r.time = c.pricer.time(ic.collective, ic.bytes, t, 1, &r.link);
      res.reshards.push_back(r);
    }
    for (size_t i = 0; i < op.operands.size(); ++i) {
      const ValueRef &ref = op.operands[i];
      const ValueInfo &val = s.geo.operand(id, int(i));
      Layout lu;
      bool isParam = false;
      if (ref.isArg()) {
        if (ref.argIndex() >= int(g.args.size()) ||
            s.nodeOfArg[ref.argIndex()] < 0)
          continue;
        lu = s.paramLayout[ref.argIndex()];
        isParam = true;
      } else {
        if (ref.producer < 0 || ref.result != 0 || s.chosen[ref.producer] < 0)
          continue;
        lu = s.resultLayout[ref.producer];
      }
      const Layout req = sg.operands[i];
      auto add = [&](const Reshard &rs, bool bwd) {
        if (!rs.needed)
          return;
        ReshardOp r;
        r.consumer = id;
        r.operand = int(i);
        r.producer = producerName(ref);
        r.what = rs.str();
        r.backward = bwd;
        r.perStep = bwd && isParam;
        r.collective = rs.collective;
        r.groupSize = t;
        r.bytes = rs.bytes;
        r.time = c.pricer.time(rs, t, &r.link);
        res.reshards.push_back(r);
      };
      add(reshard(lu, req, val.bytes, t), false);
      if (c.train && val.needsGrad)
        add(reshard(gradLayout(req, sg.divisor), gradNeed(lu), val.bytes, t),
            true);
    }
  }
  for (const ReshardOp &r : res.reshards)
    tpTotal += r.time * (r.perStep ? 1.0 : m);

  // Per-step collectives, in the transformer report's form.
  auto record = [&](const std::string &what, Collective coll, int size,
                    int stride, double bytes, double calls, double exposed) {
    if (size <= 1 || calls <= 0 || bytes <= 0)
      return;
    LinkKind link = LinkKind::None;
    double time = calls * c.pricer.time(coll, bytes, size, stride, &link);
    res.comms.push_back(
        {what, coll, size, bytes, calls, link, time, exposed});
  };
  if (t > 1 && !res.reshards.empty()) {
    // Summed: the per-op list is in `reshards`.
    CommOp op;
    op.what = "tp resharding + op collectives (all)";
    op.collective = Collective::AllReduce;
    op.groupSize = t;
    op.calls = 0;
    for (const ReshardOp &r : res.reshards) {
      op.calls += r.perStep ? 1 : m;
      op.bytes = std::max(op.bytes, r.bytes);
      if (r.link == LinkKind::Network || op.link == LinkKind::None)
        op.link = r.link;
    }
    op.time = tpTotal;
    op.exposed = res.best.time.tpComm;
    res.comms.push_back(op);
  }
  // Chunk ranges (one per stage, or v per stage interleaved) and their
  // boundaries.
  const int chunks = int(pr.starts.size()) - 1;
  for (int ch = 0; ch < chunks; ++ch) {
    OpStage os;
    os.stage = ch % pp;
    int fromPos = pr.unitStart[pr.starts[ch]];
    int toPos = pr.unitStart[pr.starts[ch + 1]] - 1;
    os.firstOp = c.fwdOps[fromPos];
    os.lastOp = c.fwdOps[toPos];
    os.numOps = toPos - fromPos + 1;
    for (int i = fromPos; i <= toPos; ++i) {
      int id = c.fwdOps[i];
      os.timePerMicroBatch += s.compute[id] + s.mbComm[id];
      int64_t l = g.ops[id].layer;
      if (l >= 0) {
        if (os.firstLayer < 0)
          os.firstLayer = l;
        os.lastLayer = l;
      }
    }
    res.stages.push_back(os);
  }
  if (pp > 1) {
    std::vector<int> stageOf(g.ops.size(), -1); // the chunk, here
    for (int ch = 0; ch < chunks; ++ch)
      for (int i = pr.unitStart[pr.starts[ch]];
           i < pr.unitStart[pr.starts[ch + 1]]; ++i)
        stageOf[c.fwdOps[i]] = ch;
    std::vector<int> lastUse(g.ops.size(), -1);
    for (int id : c.fwdOps)
      for (const ValueRef &r : g.ops[id].operands)
        if (!r.isArg() && r.producer >= 0 && stageOf[r.producer] >= 0)
          lastUse[r.producer] = std::max(lastUse[r.producer], stageOf[id]);
    for (int id : c.fwdOps) {
      if (lastUse[id] <= stageOf[id] || g.ops[id].kind == OpClass::Constant)
        continue;
      double b = s.geo.result(id).bytes /
                 (s.resultLayout[id].kind == Layout::S ? double(t) : 1.0);
      for (int sg = stageOf[id]; sg < lastUse[id]; ++sg)
        res.stages[sg].boundaryBytes += b;
    }
    double worst = 0;
    for (int ch = 0; ch + 1 < chunks; ++ch)
      worst = std::max(worst, res.stages[ch].boundaryBytes);
    record("pp send/recv (stage boundary)", Collective::SendRecv, 2, t * dp,
           worst, (c.train ? 2 : 1) * m * (chunks / pp),
           res.best.time.ppComm);
  }
  if (c.train && dp > 1) {
    double elems = 0;
    for (size_t a = 0; a < g.args.size(); ++a)
      if (s.nodeOfArg[a] >= 0) {
        double e = 1;
        for (int64_t d : g.args[a].shape)
          e *= double(d);
        elems += e / (s.paramLayout[a].kind == Layout::S ? double(t) : 1.0);
      }
    elems /= pp; // roughly one stage's share
    const TrainingConfig &cfg = res.best.cfg;
    double grads = elems * cfg.precision.gradBytes;
    double params = elems * cfg.precision.paramBytes;
    if (cfg.zeroStage == 0) {
      record("dp gradient all-reduce", Collective::AllReduce, dp, t, grads, 1,
             res.best.time.dpComm);
    } else {
      record("dp gradient reduce-scatter", Collective::ReduceScatter, dp, t,
             grads, cfg.zeroStage >= 2 ? m : 1, res.best.time.dpComm);
      if (cfg.zeroStage < 3)
        record("dp parameter all-gather (after update)", Collective::AllGather,
               dp, t, params, 1, 0);
      else {
        record("dp zero-3 parameter all-gather (forward)", Collective::AllGather,
               dp, t, params, m, 0);
        // The backward pass gathers only what it reads.
        record("dp zero-3 parameter all-gather (backward)", Collective::AllGather,
               dp, t, params * c.bwdReadFraction, m, 0);
      }
    }
  }

  // The plan: the ILP's layouts over tp, batch dims over dp.
  res.plan = planFromConfig(PlanKind::OpLevel, g, cluster, res.best.cfg, gb,
                            c.train, opt.precision,
                            ProcessLayout::BetweenGraph);
  {
    auto sharding = [&](Layout l, size_t rank, int batchDim) {
      Sharding sh = Sharding::replicated(int(rank));
      if (dp > 1 && batchDim >= 0 && batchDim < int(rank))
        sh.split[batchDim].push_back("dp");
      if (t > 1 && l.kind == Layout::S && l.dim >= 0 && l.dim < int(rank))
        sh.split[l.dim].push_back("tp");
      else if (t > 1 && l.kind == Layout::P)
        sh.partial.push_back("tp");
      return sh;
    };
    std::vector<int> stageOfOp(g.ops.size(), 0);
    for (int ch = 0; ch + 1 < int(pr.starts.size()); ++ch)
      for (int i = pr.unitStart[pr.starts[ch]];
           i < pr.unitStart[pr.starts[ch + 1]]; ++i)
        stageOfOp[c.fwdOps[i]] = ch % pp;
    for (const OpChoice &ch : res.choices) {
      const OpNode &n = g.ops[ch.op];
      PlannedOp po;
      po.id = n.key();
      po.op = n.op;
      po.stage = stageOfOp[ch.op];
      po.strategy = ch.strategy;
      for (size_t k = 0; k < n.operands.size(); ++k)
        po.operands.push_back(sharding(
            k < ch.operands.size() ? ch.operands[k] : Layout::rep(),
            n.operandShapes[k].size(), s.geo.operand(ch.op, int(k)).batchDim));
      po.results.push_back(
          sharding(ch.result, n.shape.size(), s.geo.batchDim(ch.op)));
      // Results the rules do not describe: like result #0 when shaped like
      // it, else replicated.
      for (int k = 1; k < n.numResults; ++k) {
        std::vector<int64_t> shape = g.resultShape(n, k);
        po.results.push_back(shape == n.shape
                                 ? po.results[0]
                                 : Sharding::replicated(int(shape.size())));
      }
      res.plan.ops.push_back(std::move(po));
    }
    std::map<std::string, Layout> paramLayout(res.params.begin(),
                                              res.params.end());
    for (const ArgNode &a : g.args) {
      auto it = paramLayout.find(a.name);
      Layout l = it == paramLayout.end() ? Layout::rep() : it->second;
      int batchDim =
          a.role == ArgNode::Role::Input ? s.geo.arg(a.index).batchDim : -1;
      res.plan.args.push_back(
          {a.name, a.role, sharding(l, a.shape.size(), batchDim)});
    }
  }

  res.globalBatch = gb;
  res.training = c.train;
  res.precision = opt.precision;
  res.peakFlops = c.gpu.peak(opt.precision);
  res.modelFlopsPerStep =
      fwdFlops / double(B) * double(gb) * (c.train ? 1 + c.ratio : 1.0);
  st.seconds = since(t0);
  return res;
}

//===----------------------------------------------------------------------===//
// Reports
//===----------------------------------------------------------------------===//

namespace {

/// "dlopt.matmul x3: column 2, row 1", by first appearance.
std::vector<std::pair<std::string, std::vector<std::pair<std::string, int>>>>
groupChoices(const OpPlanResult &p, const GraphSummary &g) {
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, int>>>>
      out;
  for (const OpChoice &c : p.choices) {
    const OpNode &op = g.ops[c.op];
    if (op.kind == OpClass::Constant)
      continue;
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const auto &e) { return e.first == op.op; });
    if (it == out.end()) {
      out.push_back({op.op, {}});
      it = out.end() - 1;
    }
    auto jt = std::find_if(it->second.begin(), it->second.end(),
                           [&](const auto &e) { return e.first == c.strategy; });
    if (jt == it->second.end())
      it->second.push_back({c.strategy, 1});
    else
      ++jt->second;
  }
  return out;
}

std::string layouts(const std::vector<Layout> &ls) {
  std::string s;
  for (const Layout &l : ls)
    s += (s.empty() ? "" : ",") + l.str();
  return s.empty() ? "-" : s;
}

Throughput derive(const OpPlanResult &p, int devices) {
  return throughput(p.best.time.total(), double(p.globalBatch),
                    p.modelFlopsPerStep, p.peakFlops, devices);
}

} // namespace

std::string formatOpTextReport(const OpPlanResult &p, const Cluster &cluster,
                               const GraphSummary &g, const ReportOptions &o) {
  const TrainingConfig &cfg = p.best.cfg;
  const int devices = cluster.numDevices();
  Throughput d = derive(p, devices);
  std::string r;
  r += textTitle(p.training, g.modelName, cluster);
  int nParams = int(p.params.size());
  r += strf("model: %d ops (op-level plan), %s parameters in %d tensors, "
            "dtype %s, compute %s\n",
            p.numForwardOps, withCommas(g.totalParams).c_str(), nParams,
            g.dtype.c_str(), precisionName(p.precision));
  if (p.training)
    r += strf("training step priced as forward x %.2f (%s)\n",
              1 + p.backwardRatio,
              p.backwardFromGraph
                  ? strf("%d backward ops in the graph",
                         p.numBackwardOps).c_str()
                  : "backward_flops_ratio of the calibration");
  if (p.numBackwardOps > 0)
    r += strf("backward ops (%d) follow their forward ops' sharding and "
              "stage; %d update ops after them are priced as the optimizer "
              "step\n",
              p.numBackwardOps, p.numUpdateOps);
  r += strf("global batch %lld samples\n\n", (long long)p.globalBatch);

  r += "== plan ==\n";
  r += strf("  dp=%d tp=%d pp=%d (dp*tp*pp = %d devices)\n", cfg.dp, cfg.tp,
            cfg.pp, cfg.dp * cfg.tp * cfg.pp);
  r += strf("  micro-batch size %lld, %lld micro-batches per step\n",
            (long long)cfg.microBatchSize, (long long)cfg.numMicroBatches);
  r += strf("  schedule %s, zero %d, optimizer %s\n", scheduleKey(cfg.schedule),
            cfg.zeroStage, optimizerName(cfg.optimizer));
  r += "  processes: one per GPU (between-graph)\n";
  r += strf("  sharding: per op over tp=%d (docs/op-sharding.md)%s\n", cfg.tp,
            p.best.memoryConstrained ? ", memory-constrained" : "");
  {
    const SolveResult &s = p.solve;
    std::string how = s.method;
    if (s.ilpVars > 0)
      how += strf(" (%lld variables, %lld constraints, %s)",
                  (long long)s.ilpVars, (long long)s.ilpRows,
                  seconds(s.ilpSeconds).c_str());
    r += strf("  solver: %s over %lld strategy nodes and %lld edges, %d left "
              "after elimination, %s\n",
              how.c_str(), (long long)p.stats.problemNodes,
              (long long)p.stats.problemEdges, s.coreNodes,
              s.optimal ? "optimal" : "not proven optimal");
    if (!s.note.empty())
      r += "  note: " + s.note + "\n";
  }
  if (cfg.tp > 1) {
    bool allReplicated = true;
    for (const OpChoice &c : p.choices)
      allReplicated &= c.strategy == "replicated";
    if (allReplicated)
      r += strf("  note: every op is replicated over tp=%d: the %d devices "
                "of a tp group compute the same thing (the model is too "
                "small for more devices to pay off)\n",
                cfg.tp, cfg.tp);
  }

  r += strf("\n== sharding over tp=%d (op: strategy count) ==\n", cfg.tp);
  for (const auto &[name, strategies] : groupChoices(p, g)) {
    int total = 0;
    std::string list;
    for (const auto &[sname, n] : strategies) {
      total += n;
      list += (list.empty() ? "" : ", ") + sname + " " + std::to_string(n);
    }
    r += strf("  %s x%d: %s\n", name.c_str(), total, list.c_str());
  }
  {
    int split = 0;
    double bytes = 0, full = 0;
    for (size_t i = 0; i < p.params.size(); ++i)
      if (p.params[i].second.kind == Layout::S)
        ++split;
    for (const ArgNode &a : g.args)
      if (a.role == ArgNode::Role::Param) {
        double e = double(a.elemBytes);
        for (int64_t dd : a.shape)
          e *= double(dd);
        full += e;
        auto it = std::find_if(p.params.begin(), p.params.end(),
                               [&](const auto &x) { return x.first == a.name; });
        bytes += it != p.params.end() && it->second.kind == Layout::S
                     ? e / cfg.tp
                     : e;
      }
    r += strf("  params: %d split over tp, %d replicated (%s of %s per "
              "device before ZeRO)\n",
              split, int(p.params.size()) - split, humanBytes(bytes).c_str(),
              humanBytes(full).c_str());
  }
  if (o.explain) {
    r += "  per op (id op strategy: operands -> result):\n";
    for (const OpChoice &c : p.choices) {
      const OpNode &op = g.ops[c.op];
      if (op.kind == OpClass::Constant)
        continue;
      r += strf("    #%-4d %-22s %-14s %s -> %s\n", c.op, op.op.c_str(),
                c.strategy.c_str(), layouts(c.operands).c_str(),
                c.result.str().c_str());
    }
  }

  r += "\n== resharding and op collectives over tp (one rank) ==\n";
  if (p.reshards.empty()) {
    r += "  none\n";
  } else {
    std::vector<const ReshardOp *> order;
    for (const ReshardOp &x : p.reshards)
      order.push_back(&x);
    const double m = double(cfg.numMicroBatches);
    auto perStep = [&](const ReshardOp *x) {
      return x->time * (x->perStep ? 1.0 : m);
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](const ReshardOp *a, const ReshardOp *b) {
                       return perStep(a) > perStep(b);
                     });
    size_t shown = o.explain ? order.size() : std::min<size_t>(order.size(), 12);
    for (size_t i = 0; i < shown; ++i) {
      const ReshardOp &x = *order[i];
      std::string where = "#" + std::to_string(x.consumer) + " " +
                          g.ops[x.consumer].op;
      if (x.operand >= 0)
        where += " operand " + std::to_string(x.operand) + " <- " + x.producer;
      r += strf("  %-56s %s %s, group %d, %s, link %s, %s %s\n", where.c_str(),
                x.backward ? "bwd" : "fwd", x.what.c_str(), x.groupSize,
                humanBytes(x.bytes).c_str(), linkName(x.link),
                seconds(x.time).c_str(),
                x.perStep ? "per step" : "per micro-batch");
    }
    if (shown < order.size()) {
      double rest = 0;
      for (size_t i = shown; i < order.size(); ++i)
        rest += perStep(order[i]);
      r += strf("  ... %zu more (%s per step; --explain lists them)\n",
                order.size() - shown, seconds(rest).c_str());
    }
  }

  r += "\n== ranks ==\n";
  r += "  rank  node  gpu  process  stage  tp  dp\n";
  int shownRanks = std::min(devices, o.maxRanks);
  for (int rank = 0; rank < shownRanks; ++rank) {
    auto loc = cluster.locate(rank);
    RankCoords rc = rankCoords(cfg, rank);
    r += strf("  %4d  %4d  %3d  %7d  %5d  %2d  %2d\n", rank,
              loc ? loc->node : -1, loc ? loc->local : -1, rank, rc.stage,
              rc.tp, rc.dp);
  }
  if (shownRanks < devices)
    r += strf("  ... %d more ranks: rank = (stage*%d + dp)*%d + tp; node = "
              "rank / gpus per node\n",
              devices - shownRanks, cfg.dp, cfg.tp);

  r += strf("\n== stages (%s) ==\n",
            p.stagesByLayer ? "contiguous layer marks" : "contiguous ops");
  for (size_t s = 0; s < p.stages.size(); ++s) {
    const OpStage &x = p.stages[s];
    std::string layers;
    if (x.firstLayer >= 0)
      layers = x.firstLayer == x.lastLayer
                   ? strf(", layer %lld", (long long)x.firstLayer)
                   : strf(", layers %lld-%lld", (long long)x.firstLayer,
                          (long long)x.lastLayer);
    std::string name = p.stages.size() > size_t(cfg.pp)
                           ? strf("chunk %zu (stage %d)", s, x.stage)
                           : strf("stage %zu", s);
    r += strf("  %s: ops %d-%d (%d ops%s), %s per micro-batch", name.c_str(),
              x.firstOp, x.lastOp, x.numOps, layers.c_str(),
              seconds(x.timePerMicroBatch).c_str());
    if (s + 1 < p.stages.size())
      r += strf(", sends %s", humanBytes(x.boundaryBytes).c_str());
    r += "\n";
  }

  r += textCommunication(p.comms);

  const StepTime &t = p.best.time;
  r += textStepTimeHead(t, d.step);
  r += strf("  exposed comm     %s (%.1f%%): tp %s, pp %s, dp %s\n",
            seconds(t.exposedComm()).c_str(), 100 * t.exposedComm() / d.step,
            seconds(t.tpComm).c_str(), seconds(t.ppComm).c_str(),
            seconds(t.dpComm).c_str());
  r += textTimeRow("bubble", t.bubble, d.step);
  r += "\n== throughput ==\n";
  r += strf("  %.4g samples/s\n", d.samples);
  r += strf("  model %.3f TFLOP/s per GPU, MFU %.1f%% (%s peak %.1f TFLOP/s, "
            "the graph's FLOPs%s)\n",
            d.tflopsPerGpu / 1e12, 100 * d.mfu, precisionName(p.precision),
            p.peakFlops / 1e12, p.training ? " with backward" : "");

  const MemoryBreakdown &m = p.best.memory;
  r += strf("\n== memory per device (stage %d, the largest) ==\n", m.stage);
  r += textMemoryRows(m, p.best.capacity);
  r += textAlternatives(p.alternatives);

  if (o.explain) {
    const OpSearchStats &s = p.stats;
    r += textSearchHead(s.priced, s.feasible, s.outOfMemory);
    r += strf("  %lld strategy problems solved (%lld reached the ILP; "
              "largest core %lld nodes, largest ILP %lld variables x %lld "
              "constraints; ILP time %s)\n",
              (long long)s.solves, (long long)s.ilpSolves,
              (long long)s.maxCoreNodes, (long long)s.maxIlpVars,
              (long long)s.maxIlpRows, seconds(s.ilpSeconds).c_str());
    r += std::string("  ILP solver: ") +
         (haveIlpSolver() ? "COIN-OR CBC" : "none (built without CBC)") + "\n";
    for (const auto &n : s.notes)
      r += "  fallback: " + n + "\n";
    r += textSearchTail(s.pruned, s.seconds);
  }
  return r;
}

std::string formatOpJsonReport(const OpPlanResult &p, const Cluster &cluster,
                               const GraphSummary &g, const ReportOptions &o) {
  const int devices = cluster.numDevices();
  Throughput d = derive(p, devices);
  auto config = [](const OpCandidate &c) {
    json j;
    j["dp"] = c.cfg.dp;
    j["tp"] = c.cfg.tp;
    j["pp"] = c.cfg.pp;
    j["micro_batch_size"] = c.cfg.microBatchSize;
    j["num_micro_batches"] = c.cfg.numMicroBatches;
    j["schedule"] = scheduleKey(c.cfg.schedule);
    j["zero_stage"] = c.cfg.zeroStage;
    j["recompute"] = recomputeName(RecomputePolicy::None);
    j["optimizer"] = optimizerName(c.cfg.optimizer);
    return j;
  };
  // The plan (what --plan reads back), then the report (never read).
  json j = planJson(p.plan);
  json r;
  r["model"] = {{"param_tensors", p.params.size()},
                {"backward_ratio", p.backwardRatio}};
  r["solver"] = {{"method", p.solve.method},
                 {"optimal", p.solve.optimal},
                 {"nodes", p.stats.problemNodes},
                 {"edges", p.stats.problemEdges},
                 {"core_nodes", p.solve.coreNodes},
                 {"ilp_variables", p.solve.ilpVars},
                 {"ilp_constraints", p.solve.ilpRows},
                 {"ilp_seconds", p.solve.ilpSeconds},
                 {"note", p.solve.note},
                 {"memory_constrained", p.best.memoryConstrained}};
  json summary = json::object();
  for (const auto &[name, strategies] : groupChoices(p, g)) {
    json e = json::object();
    for (const auto &[sname, n] : strategies)
      e[sname] = n;
    summary[name] = e;
  }
  r["sharding_summary"] = summary;
  // Per op: the ILP's strategy in the tp layouts of docs/op-sharding.md
  // (the plan's "ops" hold the same choice as mesh shardings).
  json ops = json::array();
  for (const OpChoice &c : p.choices) {
    json ol = json::array();
    for (const Layout &l : c.operands)
      ol.push_back(l.str());
    ops.push_back({{"id", g.ops[c.op].key()},
                   {"op", g.ops[c.op].op},
                   {"strategy", c.strategy},
                   {"operands", ol},
                   {"result", c.result.str()},
                   {"time", c.time}});
  }
  r["ops"] = ops;
  json params = json::array();
  for (const auto &[name, l] : p.params)
    params.push_back({{"name", name}, {"layout", l.str()}});
  r["params"] = params;
  json rs = json::array();
  for (const ReshardOp &x : p.reshards)
    rs.push_back({{"op", g.ops[x.consumer].key()},
                  {"operand", x.operand},
                  {"producer", x.producer},
                  {"what", x.what},
                  {"pass", x.backward ? "backward" : "forward"},
                  {"per", x.perStep ? "step" : "micro-batch"},
                  {"collective", collectiveName(x.collective)},
                  {"group_size", x.groupSize},
                  {"bytes", x.bytes},
                  {"link", linkName(x.link)},
                  {"time", x.time}});
  r["resharding"] = rs;
  json stages = json::array();
  for (size_t s = 0; s < p.stages.size(); ++s) {
    const OpStage &x = p.stages[s];
    stages.push_back({{"stage", x.stage},
                      {"chunk", s},
                      {"first_op", g.ops[x.firstOp].key()},
                      {"last_op", g.ops[x.lastOp].key()},
                      {"num_ops", x.numOps},
                      {"first_layer", x.firstLayer},
                      {"last_layer", x.lastLayer},
                      {"time_per_micro_batch", x.timePerMicroBatch},
                      {"boundary_bytes", x.boundaryBytes}});
  }
  r["stages"] = stages;
  r["stages_by"] = p.stagesByLayer ? "layer" : "op";
  jsonRankTable(r, devices,
                {"rank", "node", "gpu", "process", "stage", "tp", "dp"},
                "rank = (stage*dp + dp_index)*tp + tp_index", [&](int rank) {
                  auto loc = cluster.locate(rank);
                  RankCoords c = rankCoords(p.plan.mesh, rank);
                  return json{rank, loc ? loc->node : -1,
                              loc ? loc->local : -1, rank, c.stage, c.tp,
                              c.dp};
                });
  r["communication"] = jsonCommunication(p.comms);
  const StepTime &t = p.best.time;
  r["step_time"] = {{"total", t.total()},   {"compute", t.compute},
                    {"tp_comm", t.tpComm},  {"pp_comm", t.ppComm},
                    {"dp_comm", t.dpComm},  {"bubble", t.bubble}};
  r["throughput"] = {{"samples_per_s", d.samples},
                     {"model_tflops_per_gpu", d.tflopsPerGpu / 1e12},
                     {"mfu", d.mfu}};
  r["memory"] = jsonMemory(p.best.memory, p.best.capacity);
  r["alternatives"] = jsonAlternatives(p.alternatives, config);
  if (o.explain) {
    json pruned = jsonPruned(p.stats.pruned);
    r["search"] = {{"priced", p.stats.priced},
                   {"feasible", p.stats.feasible},
                   {"out_of_memory", p.stats.outOfMemory},
                   {"solves", p.stats.solves},
                   {"ilp_solves", p.stats.ilpSolves},
                   {"max_core_nodes", p.stats.maxCoreNodes},
                   {"max_ilp_variables", p.stats.maxIlpVars},
                   {"max_ilp_constraints", p.stats.maxIlpRows},
                   {"ilp_seconds", p.stats.ilpSeconds},
                   {"notes", p.stats.notes},
                   {"pruned", pruned},
                   {"seconds", p.stats.seconds}};
  }
  j["report"] = std::move(r);
  return j.dump(2) + "\n";
}

} // namespace dlopt::planner
