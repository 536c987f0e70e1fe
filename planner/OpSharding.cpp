//===- OpSharding.cpp - Sharding rules per op class, resharding costs -----===//
#include "planner/OpSharding.h"

#include <algorithm>
#include <cmath>

namespace dlopt::planner {

//===----------------------------------------------------------------------===//
// Layouts and resharding
//===----------------------------------------------------------------------===//

std::string Layout::str() const {
  switch (kind) {
  case R:
    return "R";
  case S: {
    std::string s(1, 'S'); // (not "S" + ...: a GCC 12 -Wrestrict false alarm)
    s += std::to_string(dim);
    return s;
  }
  case P:
    return "P";
  }
  return "?";
}

std::optional<Layout> Layout::parse(std::string_view text) {
  if (text == "R")
    return rep();
  if (text == "P")
    return partial();
  if (text.size() < 2 || text.size() > 3 || text[0] != 'S')
    return std::nullopt;
  int d = 0;
  for (char c : text.substr(1)) {
    if (c < '0' || c > '9')
      return std::nullopt;
    d = d * 10 + (c - '0');
  }
  if (d > 15 || (text.size() == 3 && text[1] == '0'))
    return std::nullopt;
  return split(d);
}

Layout gradLayout(Layout required, int divisor) {
  if (required.kind == Layout::P)
    return Layout::rep();
  if (required.kind == Layout::R && divisor > 1)
    return Layout::partial();
  return required;
}

Layout gradNeed(Layout produced) {
  return produced.kind == Layout::P ? Layout::rep() : produced;
}

std::string Reshard::str() const {
  std::string s = needed ? collectiveName(collective) : "local";
  return s + " " + from.str() + "->" + to.str();
}

Reshard reshard(Layout from, Layout to, double fullBytes, int t) {
  Reshard r;
  r.from = from;
  r.to = to;
  if (from == to || t <= 1 || fullBytes <= 0)
    return r;
  // To R or S from anything but P with the same/other split:
  switch (from.kind) {
  case Layout::R:
    return r; // R->S slice, R->P keep on rank 0: local
  case Layout::S:
    if (to.kind == Layout::R) {
      r.needed = true;
      r.collective = Collective::AllGather;
      r.bytes = fullBytes;
    } else if (to.kind == Layout::S) {
      r.needed = true;
      r.collective = Collective::AllToAll;
      r.bytes = fullBytes / t;
    } // S->P: the slice in place, zeros elsewhere: local
    return r;
  case Layout::P:
    r.needed = true;
    r.bytes = fullBytes;
    r.collective = to.kind == Layout::R ? Collective::AllReduce
                                        : Collective::ReduceScatter;
    return r;
  }
  return r;
}

double CommPricer::time(Collective c, double bytes, int size, int stride,
                        LinkKind *link, CommAlgorithm *algorithm,
                        CommProtocol *protocol) const {
  if (size <= 1 || bytes <= 0)
    return 0;
  const Expected<CommGroup> *g = nullptr;
  for (const auto &[key, grp] : groups_)
    if (key.first == size && key.second == stride)
      g = &grp;
  if (!g) {
    groups_.emplace_back(std::make_pair(size, stride),
                         cluster_->stridedGroup(size, stride, 0));
    g = &groups_.back().second;
  }
  if (!*g)
    return 0;
  auto e = cost_->commTime(c, bytes, **g);
  if (!e)
    return 0;
  if (link)
    *link = e->link;
  if (algorithm)
    *algorithm = e->algorithm;
  if (protocol)
    *protocol = e->protocol;
  return e->time;
}

OpKind rooflineKind(const OpNode &op) {
  if (op.kind == OpClass::Matmul || op.kind == OpClass::Conv2D ||
      op.op == "dlopt.conv2d_grad_input" || op.op == "dlopt.conv2d_grad_filter")
    return OpKind::Matmul;
  if (op.kind == OpClass::Attention || op.op == "dlopt.attention_grad")
    return OpKind::Attention;
  return OpKind::Elementwise;
}

//===----------------------------------------------------------------------===//
// Geometry
//===----------------------------------------------------------------------===//

namespace {

double product(const std::vector<int64_t> &s, size_t from, size_t to) {
  double p = 1;
  for (size_t i = from; i < to && i < s.size(); ++i)
    p *= static_cast<double>(s[i]);
  return p;
}

double elements(const std::vector<int64_t> &s) {
  return product(s, 0, s.size());
}

/// The dim of `out` that starts at the same flat offset granularity as dim
/// `d` of `in` (both row-major views of the same elements): splitting one in
/// t contiguous blocks is splitting the other. -1 if none.
int mapReshapeDim(const std::vector<int64_t> &in,
                  const std::vector<int64_t> &out, int d) {
  if (d < 0 || d >= int(in.size()) || in[d] == 1)
    return -1;
  double before = product(in, 0, size_t(d));
  double acc = 1;
  for (size_t j = 0; j < out.size(); ++j) {
    if (acc == before && out[j] != 1)
      return int(j);
    acc *= static_cast<double>(out[j]);
    if (acc > before)
      return -1;
  }
  return -1;
}

bool divisible(const std::vector<int64_t> &shape, int d, int t) {
  return d >= 0 && d < int(shape.size()) && shape[d] >= t && shape[d] % t == 0;
}

/// Batch dim of result #0 given its operands' batch dims.
int propagateBatchDim(const OpNode &op, const std::vector<int> &in) {
  const int r = int(op.shape.size());
  auto inRank = [&](size_t i) { return int(op.operandShapes[i].size()); };
  auto aligned = [&](size_t i) {
    if (i >= in.size() || in[i] < 0)
      return -1;
    int d = in[i] + (r - inRank(i));
    if (d < 0 || d >= r || op.operandShapes[i][in[i]] != op.shape[d])
      return -1;
    return d;
  };
  auto firstAligned = [&]() {
    for (size_t i = 0; i < in.size(); ++i)
      if (int d = aligned(i); d >= 0)
        return d;
    return -1;
  };
  auto same = [&](size_t i) {
    return i < in.size() && in[i] >= 0 && in[i] < r ? in[i] : -1;
  };
  switch (op.kind) {
  case OpClass::Constant:
  case OpClass::Loss:
    return -1;
  case OpClass::Elementwise:
  case OpClass::Rope:
  case OpClass::Softmax:
  case OpClass::Norm:
  case OpClass::Broadcast:
    return firstAligned();
  case OpClass::Matmul: {
    if (op.operandShapes.size() < 2 || r < 2)
      return -1;
    int rl = inRank(0), rr = inRank(1);
    if (in.size() > 0 && in[0] >= 0) {
      int m = op.transposeA ? rl - 1 : rl - 2;
      if (in[0] == m)
        return r - 2;
      if (in[0] < rl - 2)
        return aligned(0);
    }
    if (in.size() > 1 && in[1] >= 0) {
      int n = op.transposeB ? rr - 2 : rr - 1;
      if (in[1] == n)
        return r - 1;
      if (in[1] < rr - 2)
        return aligned(1);
    }
    return -1;
  }
  case OpClass::Reduction: {
    int b = in.empty() ? -1 : in[0];
    if (b < 0)
      return -1;
    int before = 0;
    for (int64_t d : op.dims) {
      int64_t nd = d < 0 ? d + inRank(0) : d;
      if (nd == b)
        return -1;
      if (nd < b)
        ++before;
    }
    return op.keepDims ? b : b - before;
  }
  case OpClass::Reshape:
    if (in.empty() || in[0] < 0)
      return -1;
    return mapReshapeDim(op.operandShapes[0], op.shape, in[0]);
  case OpClass::Transpose:
    if (in.empty() || in[0] < 0)
      return -1;
    for (int i = 0; i < int(op.dims.size()); ++i)
      if (op.dims[i] == in[0])
        return i;
    return -1;
  case OpClass::Gather:
    return same(1);
  case OpClass::Concat:
  case OpClass::Slice:
  case OpClass::Attention:
  case OpClass::Conv2D:
  case OpClass::Pool:
  case OpClass::BatchNorm:
  case OpClass::Other:
    if (!op.operandShapes.empty() && inRank(0) == r)
      return same(0);
    return -1;
  }
  return -1;
}

} // namespace

GraphGeometry::GraphGeometry(const GraphSummary &g, int64_t microBatch,
                             double floatBytes)
    : graph_(&g), mbs_(microBatch) {
  const int64_t B = g.batch > 0 ? g.batch : 1;
  auto micro = [&](std::vector<int64_t> shape, int bd) {
    if (bd >= 0 && bd < int(shape.size())) {
      int64_t n = shape[bd];
      shape[bd] = n % B == 0 ? n / B * microBatch
                             : std::max<int64_t>(
                                   1, int64_t(std::ceil(double(n) *
                                                        double(microBatch) /
                                                        double(B))));
    }
    return shape;
  };
  auto bytesOf = [&](const std::vector<int64_t> &shape, bool isFloat,
                     int elemBytes) {
    return elements(shape) * (isFloat ? floatBytes : double(elemBytes));
  };

  args_.resize(g.args.size());
  for (size_t i = 0; i < g.args.size(); ++i) {
    const ArgNode &a = g.args[i];
    ValueInfo &v = args_[i];
    v.isFloat = a.isFloat;
    v.isParam = a.role == ArgNode::Role::Param;
    v.isFree = !v.isParam;
    v.needsGrad = v.isParam && a.isFloat;
    if (a.role == ArgNode::Role::Input && !a.shape.empty() &&
        a.shape[0] == B && g.batch > 0)
      v.batchDim = 0;
    v.shape = micro(a.shape, v.batchDim);
    v.bytes = bytesOf(v.shape, a.isFloat, a.elemBytes);
  }

  const size_t n = g.ops.size();
  results_.resize(n);
  operands_.resize(n);
  scales_.assign(n, 1.0);
  const double f = double(microBatch) / double(B);
  for (size_t id = 0; id < n; ++id) {
    const OpNode &op = g.ops[id];
    std::vector<int> inBd;
    bool anyBatch = false, anyGrad = false, allFree = true;
    for (size_t i = 0; i < op.operands.size(); ++i) {
      const ValueRef &ref = op.operands[i];
      int bd = -1;
      bool grad = false, isFree = true, isParam = false;
      if (ref.isArg()) {
        if (ref.argIndex() < int(args_.size())) {
          const ValueInfo &a = args_[ref.argIndex()];
          bd = a.batchDim;
          grad = a.needsGrad;
          isFree = a.isFree;
          isParam = a.isParam;
        }
      } else if (ref.producer < int(id)) {
        const ValueInfo &p = results_[ref.producer];
        bd = ref.result == 0 ? p.batchDim : -1;
        grad = p.needsGrad;
        isFree = p.isFree;
      }
      // Shapes as the consumer sees them (results > 0 of multi-result ops).
      ValueInfo v;
      const std::vector<int64_t> &shape =
          i < op.operandShapes.size() ? op.operandShapes[i]
                                      : std::vector<int64_t>{};
      if (bd >= int(shape.size()))
        bd = -1;
      v.batchDim = bd;
      v.shape = micro(shape, bd);
      v.isFloat = i < op.operandIsFloat.size() ? op.operandIsFloat[i] : true;
      v.bytes = bytesOf(v.shape, v.isFloat,
                        i < op.operandElemBytes.size() ? op.operandElemBytes[i]
                                                       : 4);
      v.needsGrad = grad && v.isFloat;
      v.isFree = isFree;
      v.isParam = isParam;
      anyBatch |= bd >= 0;
      anyGrad |= v.needsGrad;
      allFree &= isFree;
      inBd.push_back(bd);
      operands_[id].push_back(std::move(v));
    }
    ValueInfo &res = results_[id];
    res.batchDim = propagateBatchDim(op, inBd);
    res.shape = micro(op.shape, res.batchDim);
    res.isFloat = op.isFloat;
    res.bytes = bytesOf(res.shape, op.isFloat, op.elemBytes);
    res.needsGrad = op.isFloat && anyGrad && !op.backward;
    res.isFree = op.kind == OpClass::Constant || (allFree && !anyGrad &&
                                                  op.operands.empty());
    if (anyBatch || res.batchDim >= 0)
      scales_[id] = f;
  }
}

//===----------------------------------------------------------------------===//
// Rules
//===----------------------------------------------------------------------===//

std::vector<Layout> paramLayouts(const std::vector<int64_t> &shape, int t) {
  std::vector<Layout> out{Layout::rep()};
  if (t <= 1)
    return out;
  for (int d = 0; d < int(shape.size()); ++d)
    if (divisible(shape, d, t))
      out.push_back(Layout::split(d));
  return out;
}

namespace {

struct RuleBuilder {
  const GraphGeometry &geo;
  const OpNode &op;
  int id, t;
  std::vector<Strategy> out{};

  size_t numOperands() const { return op.operands.size(); }
  const std::vector<int64_t> &in(size_t i) const {
    return geo.operand(id, int(i)).shape;
  }
  const std::vector<int64_t> &res() const { return geo.result(id).shape; }
  int rank() const { return int(res().size()); }
  std::string dimName(int d) const {
    return d == geo.batchDim(id) ? "batch" : "dim " + std::to_string(d);
  }
  std::vector<Layout> all(Layout l) const {
    return std::vector<Layout>(numOperands(), l);
  }
  void add(std::string name, std::vector<Layout> operands, Layout result,
           int divisor, std::vector<IntrinsicComm> comms = {}) {
    Strategy s;
    s.name = std::move(name);
    s.operands = std::move(operands);
    s.result = result;
    s.divisor = divisor;
    s.comms = std::move(comms);
    // Duplicates (two dims that give the same layouts) are dropped.
    for (const Strategy &o : out)
      if (o.operands == s.operands && o.result == s.result &&
          o.divisor == s.divisor)
        return;
    out.push_back(std::move(s));
  }
  void replicated() { add("replicated", all(Layout::rep()), Layout::rep(), 1); }

  /// Split the result along `d`; operands that have the dim (aligned at the
  /// end, not broadcast) are split along it, the others replicated.
  void splitAligned(int d, const std::string &name) {
    int r = rank();
    std::vector<Layout> ops;
    for (size_t i = 0; i < numOperands(); ++i) {
      int j = d - (r - int(in(i).size()));
      if (j >= 0 && j < int(in(i).size()) && in(i)[j] == res()[d])
        ops.push_back(Layout::split(j));
      else
        ops.push_back(Layout::rep());
    }
    add(name, ops, Layout::split(d), t);
  }

  bool allFloat() const {
    if (!op.isFloat)
      return false;
    for (size_t i = 0; i < numOperands(); ++i)
      if (!geo.operand(id, int(i)).isFloat)
        return false;
    return true;
  }

  void elementwise(const std::vector<int> &excluded) {
    for (int d = 0; d < rank(); ++d) {
      if (std::find(excluded.begin(), excluded.end(), d) != excluded.end())
        continue;
      if (divisible(res(), d, t))
        splitAligned(d, dimName(d));
    }
    // Partial sums pass through ops linear in the partial operand.
    const std::string &n = op.op;
    if (!allFloat())
      return;
    if (n == "dlopt.add" || n == "dlopt.sub")
      add("partial", all(Layout::partial()), Layout::partial(), 1);
    else if ((n == "dlopt.neg" || n == "dlopt.cast" || n == "dlopt.dropout") &&
             numOperands() >= 1) {
      std::vector<Layout> ops = all(Layout::rep());
      ops[0] = Layout::partial();
      add("partial", ops, Layout::partial(), 1);
    } else if (n == "dlopt.mul" && numOperands() == 2) {
      add("partial", {Layout::partial(), Layout::rep()}, Layout::partial(), 1);
      add("partial", {Layout::rep(), Layout::partial()}, Layout::partial(), 1);
    } else if (n == "dlopt.div" && numOperands() == 2) {
      add("partial", {Layout::partial(), Layout::rep()}, Layout::partial(), 1);
    }
  }

  void matmul() {
    if (numOperands() < 2 || in(0).size() < 2 || in(1).size() < 2 ||
        rank() < 2)
      return;
    const int r = rank(), rl = int(in(0).size()), rr = int(in(1).size());
    const int mL = op.transposeA ? rl - 1 : rl - 2;
    const int kL = op.transposeA ? rl - 2 : rl - 1;
    const int kR = op.transposeB ? rr - 1 : rr - 2;
    const int nR = op.transposeB ? rr - 2 : rr - 1;
    auto rest = [&](std::vector<Layout> l) {
      l.resize(numOperands(), Layout::rep());
      return l;
    };
    // Batch dims of the result (broadcast like elementwise ops).
    for (int d = 0; d < r - 2; ++d) {
      if (!divisible(res(), d, t))
        continue;
      auto pick = [&](int i, int ri) {
        int j = d - (r - ri);
        return j >= 0 && j < ri - 2 && in(i)[j] == res()[d] ? Layout::split(j)
                                                           : Layout::rep();
      };
      Layout a = pick(0, rl), b = pick(1, rr);
      if (a.kind == Layout::R && b.kind == Layout::R)
        continue;
      add(dimName(d), rest({a, b}), Layout::split(d), t);
    }
    if (divisible(in(0), mL, t))
      add(r - 2 == geo.batchDim(id) ? "batch" : "m-split",
          rest({Layout::split(mL), Layout::rep()}), Layout::split(r - 2), t);
    if (divisible(in(1), nR, t))
      add("column", rest({Layout::rep(), Layout::split(nR)}),
          Layout::split(r - 1), t);
    if (divisible(in(0), kL, t) && divisible(in(1), kR, t))
      add("row", rest({Layout::split(kL), Layout::split(kR)}),
          Layout::partial(), t);
  }

  void reduction() {
    if (numOperands() < 1)
      return;
    const auto &x = in(0);
    const int ri = int(x.size());
    std::vector<int> dims;
    for (int64_t d : op.dims)
      dims.push_back(int(d < 0 ? d + ri : d));
    const bool linear = op.op != "dlopt.max";
    for (int d = 0; d < ri; ++d) {
      if (!divisible(x, d, t))
        continue;
      std::vector<Layout> ops = all(Layout::rep());
      ops[0] = Layout::split(d);
      if (std::find(dims.begin(), dims.end(), d) == dims.end()) {
        int before = 0;
        for (int e : dims)
          before += e < d;
        int rd = op.keepDims ? d : d - before;
        add(d == geo.operand(id, 0).batchDim ? "batch"
                                              : "dim " + std::to_string(d),
            ops, Layout::split(rd), t);
      } else if (linear) {
        add("reduce-split", ops, Layout::partial(), t);
      } else {
        add("reduce-split", ops, Layout::rep(), t,
            {{Collective::AllReduce, geo.result(id).bytes, false,
              "max over a split dim"}});
      }
    }
    if (linear && allFloat()) {
      std::vector<Layout> ops = all(Layout::rep());
      ops[0] = Layout::partial();
      add("partial", ops, Layout::partial(), 1);
    }
  }

  void gather() {
    if (numOperands() < 2)
      return;
    const auto &table = in(0), &ids = in(1);
    const int ri = int(ids.size());
    for (int d = 0; d < ri; ++d)
      if (divisible(ids, d, t))
        add(d == geo.operand(id, 1).batchDim ? "batch"
                                              : "ids dim " + std::to_string(d),
            {Layout::rep(), Layout::split(d)}, Layout::split(d), t);
    if (divisible(table, 0, t) && op.isFloat)
      add("vocab rows", {Layout::split(0), Layout::rep()}, Layout::partial(),
          1);
    for (int k = 1; k < int(table.size()); ++k)
      if (divisible(table, k, t))
        add("embedding dim", {Layout::split(k), Layout::rep()},
            Layout::split(ri + k - 1), t);
  }

  void attention() {
    if (numOperands() < 3 || in(0).size() != 4 || in(1).size() != 4 ||
        in(2).size() != 4)
      return;
    auto rest = [&](std::vector<Layout> l) {
      l.resize(numOperands(), Layout::rep());
      return l;
    };
    if (divisible(in(0), 0, t))
      add("batch", rest({Layout::split(0), Layout::split(0), Layout::split(0)}),
          Layout::split(0), t);
    if (divisible(in(0), 1, t) && divisible(in(1), 1, t) &&
        divisible(in(2), 1, t))
      add("heads", rest({Layout::split(1), Layout::split(1), Layout::split(1)}),
          Layout::split(1), t);
    if (divisible(in(0), 2, t))
      add("query seq", rest({Layout::split(2), Layout::rep(), Layout::rep()}),
          Layout::split(2), t);
  }

  void conv2d() {
    if (numOperands() < 2 || in(0).size() != 4 || in(1).size() != 4)
      return;
    const auto &x = in(0), &w = in(1);
    auto bias = [&](Layout l) {
      std::vector<Layout> v{Layout::rep(), Layout::rep()};
      if (numOperands() > 2)
        v.push_back(l);
      v.resize(numOperands(), Layout::rep());
      return v;
    };
    if (divisible(x, 0, t)) {
      auto v = bias(Layout::rep());
      v[0] = Layout::split(0);
      add("batch", v, Layout::split(0), t);
    }
    if (op.groups == 1) {
      if (divisible(w, 0, t)) {
        auto v = bias(Layout::split(0));
        v[1] = Layout::split(0);
        add("out-channel", v, Layout::split(1), t);
      }
      if (!op.hasBias && divisible(x, 1, t) && divisible(w, 1, t)) {
        auto v = bias(Layout::rep());
        v[0] = Layout::split(1);
        v[1] = Layout::split(1);
        add("in-channel", v, Layout::partial(), t);
      }
    } else if (op.groups % t == 0 && divisible(x, 1, t) &&
               divisible(w, 0, t)) {
      auto v = bias(Layout::split(0));
      v[0] = Layout::split(1);
      v[1] = Layout::split(0);
      add("channel", v, Layout::split(1), t);
    }
  }

  void pool() {
    if (numOperands() < 1 || in(0).size() < 2)
      return;
    for (int d : {0, 1})
      if (divisible(in(0), d, t)) {
        auto v = all(Layout::rep());
        v[0] = Layout::split(d);
        add(d == 0 ? "batch" : "channel", v, Layout::split(d), t);
      }
    if (op.op == "dlopt.avg_pool2d")
      add("partial", all(Layout::partial()), Layout::partial(), 1);
  }

  void batchNorm() {
    if (numOperands() < 1 || in(0).size() < 2)
      return;
    const auto &x = in(0);
    if (divisible(x, 1, t)) {
      auto v = all(Layout::split(0));
      v[0] = Layout::split(1);
      add("channel", v, Layout::split(1), t);
    }
    if (divisible(x, 0, t)) {
      auto v = all(Layout::rep());
      v[0] = Layout::split(0);
      std::vector<IntrinsicComm> comms;
      if (op.training) {
        double stats = 2.0 * double(x[1]) * 4; // sum and sum of squares, f32
        comms.push_back(
            {Collective::AllReduce, stats, false, "batch-norm statistics"});
        comms.push_back(
            {Collective::AllReduce, stats, true, "batch-norm gradient sums"});
      }
      add("batch", v, Layout::split(0), t, comms);
    }
  }

  void loss() {
    if (numOperands() < 2)
      return;
    const auto &x = in(0);
    const int r = int(x.size());
    if (op.op == "dlopt.cross_entropy") {
      for (int d = 0; d + 1 < r; ++d)
        if (divisible(x, d, t)) {
          auto v = all(Layout::rep());
          v[0] = Layout::split(d);
          if (int(in(1).size()) > d && in(1)[d] == x[d])
            v[1] = Layout::split(d);
          add(d == geo.operand(id, 0).batchDim ? "batch"
                                                : "dim " + std::to_string(d),
              v, Layout::partial(), t);
        }
      if (r >= 1 && divisible(x, r - 1, t)) {
        // Vocab-parallel: max, sum of exp and the target logit per row.
        double rows = 1;
        for (int d = 0; d + 1 < r; ++d)
          rows *= double(x[d]);
        auto v = all(Layout::rep());
        v[0] = Layout::split(r - 1);
        add("class", v, Layout::rep(), t,
            {{Collective::AllReduce, 3 * rows * 4, false,
              "vocab-parallel softmax statistics"}});
      }
      return;
    }
    // mse: both operands split along the same dim -> a partial mean.
    for (int d = 0; d < r; ++d)
      if (divisible(x, d, t) && in(1).size() == x.size())
        add(d == geo.operand(id, 0).batchDim ? "batch"
                                              : "dim " + std::to_string(d),
            all(Layout::split(d)), Layout::partial(), t);
  }

  void reshape() {
    if (numOperands() < 1)
      return;
    const auto &x = in(0);
    for (int d = 0; d < int(x.size()); ++d) {
      if (!divisible(x, d, t))
        continue;
      int j = mapReshapeDim(x, res(), d);
      if (j >= 0 && divisible(res(), j, t))
        add(dimName(j), {Layout::split(d)}, Layout::split(j), t);
    }
    if (allFloat())
      add("partial", {Layout::partial()}, Layout::partial(), 1);
  }

  void transpose() {
    if (numOperands() < 1)
      return;
    for (int i = 0; i < int(op.dims.size()) && i < rank(); ++i)
      if (divisible(res(), i, t))
        add(dimName(i), {Layout::split(int(op.dims[i]))}, Layout::split(i),
            t);
    if (allFloat())
      add("partial", {Layout::partial()}, Layout::partial(), 1);
  }

  void broadcast() {
    for (int d = 0; d < rank(); ++d)
      if (divisible(res(), d, t))
        splitAligned(d, dimName(d));
    if (allFloat())
      add("partial", all(Layout::partial()), Layout::partial(), 1);
  }

  void concat() {
    const int c = op.dims.empty() ? 0 : int(op.dims[0]);
    for (int d = 0; d < rank(); ++d) {
      if (d == c)
        continue;
      bool ok = divisible(res(), d, t);
      for (size_t i = 0; ok && i < numOperands(); ++i)
        ok = divisible(in(i), d, t);
      if (ok)
        add(dimName(d), all(Layout::split(d)), Layout::split(d), t);
    }
    if (allFloat())
      add("partial", all(Layout::partial()), Layout::partial(), 1);
  }

  void slice() {
    for (int d = 0; d < rank(); ++d) {
      if (std::find(op.dims.begin(), op.dims.end(), d) != op.dims.end())
        continue;
      if (divisible(res(), d, t) && numOperands() >= 1 &&
          divisible(in(0), d, t))
        add(dimName(d), {Layout::split(d)}, Layout::split(d), t);
    }
    if (allFloat())
      add("partial", {Layout::partial()}, Layout::partial(), 1);
  }
};

} // namespace

std::vector<Strategy> shardingRules(const GraphGeometry &geo, int id, int t) {
  const OpNode &op = geo.graph().ops[id];
  RuleBuilder b{geo, op, id, t};
  b.replicated();
  if (t <= 1 || op.backward)
    return b.out;
  const int r = b.rank();
  switch (op.kind) {
  case OpClass::Constant:
  case OpClass::Other:
    break;
  case OpClass::Elementwise:
    b.elementwise({});
    break;
  case OpClass::Rope:
    b.elementwise({r - 1, r - 2});
    break;
  case OpClass::Softmax:
    b.elementwise({op.dims.empty() ? r - 1 : int(op.dims[0])});
    break;
  case OpClass::Norm: {
    std::vector<int> ex;
    for (int d = op.dims.empty() ? r - 1 : int(op.dims[0]); d < r; ++d)
      ex.push_back(d);
    b.elementwise(ex);
    break;
  }
  case OpClass::Matmul:
    b.matmul();
    break;
  case OpClass::Reduction:
    b.reduction();
    break;
  case OpClass::Gather:
    b.gather();
    break;
  case OpClass::Attention:
    b.attention();
    break;
  case OpClass::Conv2D:
    b.conv2d();
    break;
  case OpClass::Pool:
    b.pool();
    break;
  case OpClass::BatchNorm:
    b.batchNorm();
    break;
  case OpClass::Loss:
    b.loss();
    break;
  case OpClass::Reshape:
    b.reshape();
    break;
  case OpClass::Transpose:
    b.transpose();
    break;
  case OpClass::Broadcast:
    b.broadcast();
    break;
  case OpClass::Concat:
    b.concat();
    break;
  case OpClass::Slice:
    b.slice();
    break;
  }
  return b.out;
}

} // namespace dlopt::planner
