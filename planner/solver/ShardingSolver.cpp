//===- ShardingSolver.cpp - Elimination, ILP, greedy, Lagrangian ----------===//
#include "planner/solver/ShardingSolver.h"

#include "planner/ReportUtil.h"

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

using report::strf;


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

} // namespace dlopt::planner
