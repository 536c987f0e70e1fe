//===- TransformerSharding.cpp - Megatron shardings for a transformer plan ===//
#include "planner/TransformerSharding.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>

namespace dlopt::planner {

namespace {

const std::string kDp = "dp", kTp = "tp", kCp = "cp";

/// What a tensor dim is, as far as the template cares.
enum Tag : char { NoTag = 0, BatchTag = 'b', SeqTag = 's' };

using Shape = std::vector<int64_t>;
using Axes = std::vector<std::string>;

/// A value's sharding and the batch/sequence tag of each dim.
struct Val {
  Sharding s;
  std::vector<char> tags;
};

Val rep(size_t rank) {
  return {Sharding::replicated(int(rank)), std::vector<char>(rank, NoTag)};
}

bool contains(const Axes &axes, const std::string &a) {
  return std::find(axes.begin(), axes.end(), a) != axes.end();
}

Sharding dropAxis(Sharding s, const std::string &axis) {
  for (Axes &d : s.split)
    d.erase(std::remove(d.begin(), d.end(), axis), d.end());
  s.partial.erase(std::remove(s.partial.begin(), s.partial.end(), axis),
                  s.partial.end());
  return s;
}

/// The shardings of one op as the template sets them.
struct OpSharding {
  std::string strategy;
  std::vector<Sharding> operands;
  std::vector<Val> results;
};

class Lowering {
public:
  Lowering(const GraphSummary &g, const TrainingConfig &cfg)
      : g_(g), tp_(cfg.tp), cp_(std::max(1, cfg.cp)), dp_(cfg.dp),
        sp_(cfg.sequenceParallel), results_(g.ops.size()),
        args_(g.args.size()) {
    // Inputs: the batch dim over dp, the sequence dim of a [B, S] input
    // over cp. Params and states are set by their first use.
    for (const ArgNode &a : g.args) {
      if (a.role != ArgNode::Role::Input || a.shape.empty())
        continue;
      Val v = rep(a.shape.size());
      v.tags[0] = BatchTag;
      if (dp_ > 1 && a.shape[0] % dp_ == 0)
        v.s.split[0] = {kDp};
      if (a.shape.size() >= 2 && g.seq > 0 && a.shape[1] == g.seq) {
        v.tags[1] = SeqTag;
        if (cp_ > 1 && a.shape[1] % cp_ == 0)
          v.s.split[1] = {kCp};
      }
      args_[a.index] = v;
    }
  }

  OpSharding lower(const OpNode &n) {
    OpSharding o;
    switch (n.kind) {
    case OpClass::Constant:
      o.strategy = "replicated";
      o.results.push_back(rep(n.shape.size()));
      break;
    case OpClass::Matmul:
      if (n.operandShapes.size() >= 2 && n.operandShapes[0].size() >= 2 &&
          n.operandShapes[1].size() >= 2 && n.shape.size() >= 2)
        matmul(n, o);
      else
        fallback(n, o);
      break;
    case OpClass::Gather:
      gather(n, o);
      break;
    case OpClass::Attention:
      if (n.operandShapes.size() >= 3 && n.shape.size() == 4)
        attention(n, o);
      else
        fallback(n, o);
      break;
    case OpClass::Norm:
      norm(n, o);
      break;
    case OpClass::Softmax:
    case OpClass::Rope:
    case OpClass::Slice: {
      // Keep the splits except on the dims the op works along.
      std::vector<int> keepWhole;
      if (n.kind == OpClass::Softmax && !n.dims.empty())
        keepWhole.push_back(int(n.dims[0]));
      else if (n.kind == OpClass::Rope && !n.shape.empty())
        keepWhole.push_back(int(n.shape.size()) - 1);
      else
        for (int64_t d : n.dims)
          keepWhole.push_back(int(d));
      sameShape(n, o, keepWhole);
      o.strategy = "elementwise";
      break;
    }
    case OpClass::Concat:
      sameShape(n, o, n.dims.empty() ? std::vector<int>{}
                                     : std::vector<int>{int(n.dims[0])});
      o.strategy = "elementwise";
      break;
    case OpClass::Elementwise:
    case OpClass::Broadcast:
      elementwise(n, o);
      break;
    case OpClass::Loss:
      loss(n, o);
      break;
    case OpClass::Reduction:
      reduction(n, o);
      break;
    case OpClass::Reshape:
      reshape(n, o);
      break;
    case OpClass::Transpose:
      transpose(n, o);
      break;
    default:
      fallback(n, o);
      break;
    }
    // Results beyond the first: like result 0 when shaped like it, else
    // replicated.
    for (int k = int(o.results.size()); k < n.numResults; ++k) {
      Shape sh = resultShape(n, k);
      if (sh == n.shape && !o.results.empty())
        o.results.push_back(o.results[0]);
      else
        o.results.push_back(rep(sh.size()));
    }
    o.results.resize(std::max(1, n.numResults), rep(n.shape.size()));
    if (n.numResults == 0)
      o.results.clear();
    results_[n.id] = o.results;
    // The first use of a param or state decides its sharding.
    for (size_t k = 0; k < n.operands.size() && k < o.operands.size(); ++k) {
      const ValueRef &r = n.operands[k];
      if (r.isArg() && r.argIndex() < int(args_.size()) &&
          !args_[r.argIndex()])
        args_[r.argIndex()] = Val{o.operands[k],
                                  std::vector<char>(o.operands[k].rank(), 0)};
    }
    return o;
  }

  /// The sharding of every argument (replicated when unused).
  Sharding argSharding(int index) const {
    if (args_[index])
      return args_[index]->s;
    return Sharding::replicated(int(g_.args[index].shape.size()));
  }

private:
  Shape resultShape(const OpNode &n, int k) const {
    return g_.resultShape(n, k);
  }

  /// Operand `k` of `n` as produced (replicated when unknown).
  Val operand(const OpNode &n, size_t k) const {
    const Shape &sh = n.operandShapes[k];
    const ValueRef &r = n.operands[k];
    const Val *v = nullptr;
    if (r.isArg()) {
      if (r.argIndex() < int(args_.size()) && args_[r.argIndex()])
        v = &*args_[r.argIndex()];
    } else if (r.producer >= 0 && r.producer < int(results_.size()) &&
               r.result < int(results_[r.producer].size())) {
      v = &results_[r.producer][r.result];
    }
    if (!v || v->s.rank() != int(sh.size()))
      return rep(sh.size());
    return *v;
  }

  int64_t axesSize(const Axes &axes) const {
    int64_t p = 1;
    for (const std::string &a : axes)
      p *= a == kTp ? tp_ : a == kCp ? cp_ : a == kDp ? dp_ : 1;
    return p;
  }
  bool divides(int64_t dim, const Axes &axes) const {
    int64_t p = axesSize(axes);
    return p > 0 && dim % p == 0;
  }

  /// Splits the sequence dim over tp (sequence parallelism), when tp is
  /// free in the sharding and divides the dim's local size.
  void splitSeqOverTp(Val &v, const Shape &shape) const {
    if (tp_ == 1 || v.s.uses(kTp))
      return;
    for (size_t d = 0; d < v.tags.size() && d < shape.size(); ++d)
      if (v.tags[d] == SeqTag) {
        Axes axes = v.s.split[d];
        axes.push_back(kTp);
        if (divides(shape[d], axes))
          v.s.split[d] = axes;
        return;
      }
  }

  /// A partial value as a consumer needs it: summed (all-reduce), or with
  /// sequence parallelism summed into a sequence split over tp
  /// (reduce-scatter).
  Val reduced(Val v, const Shape &shape) const {
    if (v.s.partial.empty())
      return v;
    bool tp = contains(v.s.partial, kTp);
    v.s.partial.clear();
    if (sp_ && tp)
      splitSeqOverTp(v, shape);
    return v;
  }

  /// `res` (of shape `rs`) as seen by an operand of shape `os` broadcast
  /// against it (numpy alignment from the trailing dim).
  static Sharding aligned(const Sharding &res, const Shape &rs,
                          const Shape &os) {
    Sharding out = Sharding::replicated(int(os.size()));
    const int off = int(rs.size()) - int(os.size());
    for (size_t j = 0; j < os.size(); ++j) {
      int d = int(j) + off;
      if (d >= 0 && d < res.rank() && os[j] == rs[d])
        out.split[j] = res.split[d];
    }
    return out;
  }

  /// Elementwise with numpy broadcasting: each result dim takes the split
  /// of the first operand that has it at full size.
  void elementwise(const OpNode &n, OpSharding &o) {
    const Shape &R = n.shape;
    Val out = rep(R.size());
    std::set<std::string> used;
    std::vector<Val> in;
    for (size_t k = 0; k < n.operands.size(); ++k)
      in.push_back(reduced(operand(n, k), n.operandShapes[k]));
    for (size_t d = 0; d < R.size(); ++d)
      for (size_t k = 0; k < in.size(); ++k) {
        const Shape &os = n.operandShapes[k];
        int j = int(d) - (int(R.size()) - int(os.size()));
        if (j < 0 || os[j] != R[d])
          continue;
        if (!out.tags[d])
          out.tags[d] = in[k].tags[j];
        const Axes &axes = in[k].s.split[j];
        if (axes.empty() || !out.s.split[d].empty())
          continue;
        bool free = std::none_of(axes.begin(), axes.end(), [&](auto &a) {
          return used.count(a) > 0;
        });
        if (free) {
          out.s.split[d] = axes;
          used.insert(axes.begin(), axes.end());
        }
      }
    for (size_t k = 0; k < n.operands.size(); ++k)
      o.operands.push_back(aligned(out.s, R, n.operandShapes[k]));
    o.results.push_back(out);
    o.strategy = out.s.uses(kTp) ? (out.s.dimOf(kTp) >= 0 &&
                                            out.tags[out.s.dimOf(kTp)] ==
                                                SeqTag
                                        ? "sequence-parallel"
                                        : "tp-split")
                                 : "elementwise";
  }

  /// Like elementwise, but the dims in `whole` are never split.
  void sameShape(const OpNode &n, OpSharding &o,
                 const std::vector<int> &whole) {
    elementwise(n, o);
    Val &out = o.results[0];
    for (int d : whole)
      if (d >= 0 && d < out.s.rank())
        out.s.split[d].clear();
    o.operands.clear();
    for (size_t k = 0; k < n.operands.size(); ++k)
      o.operands.push_back(aligned(out.s, n.shape, n.operandShapes[k]));
  }

  bool paramCompatible(const ValueRef &r, int dim, size_t rank) const {
    if (!r.isArg() || r.argIndex() >= int(args_.size()))
      return false;
    const auto &a = args_[r.argIndex()];
    if (!a)
      return true;
    Sharding want = Sharding::replicated(int(rank));
    want.split[dim] = {kTp};
    return a->s == want;
  }

  bool isParam(const ValueRef &r) const {
    return r.isArg() && r.argIndex() < int(g_.args.size()) &&
           g_.args[r.argIndex()].role == ArgNode::Role::Param;
  }

  void matmul(const OpNode &n, OpSharding &o) {
    const Shape &ls = n.operandShapes[0], &rs = n.operandShapes[1];
    const int rl = int(ls.size()), rr = int(n.shape.size());
    const int kL = n.transposeA ? rl - 2 : rl - 1;
    const int mL = n.transposeA ? rl - 1 : rl - 2;
    Val lhs = reduced(operand(n, 0), ls);
    Val out = rep(rr);
    // Result dims: the lhs batch dims, then M, then N.
    auto fromLhs = [&](const Sharding &l) {
      for (int d = 0; d < rr - 1; ++d) {
        int j = d < rr - 2 ? d - (rr - 2 - (rl - 2)) : mL;
        if (j >= 0 && j < rl) {
          out.s.split[d] = l.split[j];
          out.tags[d] = lhs.tags[j];
        }
      }
    };
    if (isParam(n.operands[1]) && rs.size() == 2) {
      const int kR = n.transposeB ? 1 : 0, nR = 1 - kR;
      const int64_t K = rs[kR], N = rs[nR];
      Sharding rhsReq = Sharding::replicated(2);
      Sharding lhsReq = lhs.s;
      if (tp_ > 1 && contains(lhs.s.split[kL], kTp) && K % tp_ == 0 &&
          paramCompatible(n.operands[1], kR, 2)) {
        // Row-parallel: the input arrives split on K; partial sums.
        rhsReq.split[kR] = {kTp};
        lhsReq.split[kL] = {kTp};
        fromLhs(lhsReq);
        out.s.partial = {kTp};
        o.strategy = "row";
      } else {
        lhsReq = dropAxis(lhs.s, kTp); // sequence parallel: all-gather
        lhsReq.split[kL].clear();
        fromLhs(lhsReq);
        if (tp_ > 1 && N % tp_ == 0 && paramCompatible(n.operands[1], nR, 2)) {
          // Column-parallel (vocab-parallel for the LM head).
          rhsReq.split[nR] = {kTp};
          out.s.split[rr - 1] = {kTp};
          o.strategy = g_.vocab > 0 && N == g_.vocab ? "vocab-parallel"
                                                     : "column";
        } else {
          o.strategy = "replicated";
        }
      }
      o.operands = {lhsReq, rhsReq};
    } else {
      // Two activations: batch dims follow the lhs, M and N stay whole.
      Sharding lhsReq = dropAxis(lhs.s, kTp);
      lhsReq.split[kL].clear();
      lhsReq.split[mL].clear();
      fromLhs(lhsReq);
      Sharding rhsReq = Sharding::replicated(int(rs.size()));
      for (int j = 0; j < int(rs.size()) - 2; ++j) {
        int d = j + (rr - int(rs.size()));
        if (d >= 0 && rs[j] == n.shape[d])
          rhsReq.split[j] = out.s.split[d];
      }
      o.operands = {lhsReq, rhsReq};
      o.strategy = "batched";
    }
    for (size_t k = 2; k < n.operands.size(); ++k)
      o.operands.push_back(aligned(out.s, n.shape, n.operandShapes[k]));
    o.results.push_back(out);
  }

  void gather(const OpNode &n, OpSharding &o) {
    if (n.operandShapes.size() < 2 || n.operandShapes[0].empty()) {
      fallback(n, o);
      return;
    }
    const Shape &ts = n.operandShapes[0], &is = n.operandShapes[1];
    Val ids = reduced(operand(n, 1), is);
    Sharding tableReq = Sharding::replicated(int(ts.size()));
    const bool vocab = tp_ > 1 && isParam(n.operands[0]) && g_.vocab > 0 &&
                       ts[0] == g_.vocab && ts[0] % tp_ == 0 &&
                       paramCompatible(n.operands[0], 0, ts.size());
    if (vocab)
      tableReq.split[0] = {kTp};
    Val out = rep(n.shape.size());
    for (size_t j = 0; j < is.size() && j < n.shape.size(); ++j) {
      out.s.split[j] = ids.s.split[j];
      out.tags[j] = ids.tags[j];
    }
    if (vocab)
      out.s.partial = {kTp};
    o.operands = {tableReq, ids.s};
    o.results.push_back(out);
    o.strategy = vocab ? "vocab-parallel" : "replicated";
  }

  void attention(const OpNode &n, OpSharding &o) {
    Val q = reduced(operand(n, 0), n.operandShapes[0]);
    Sharding qs = q.s;
    // Heads over tp (as the QKV projection split them), sequence over cp
    // (ring), never the head dim.
    qs.split[2].erase(std::remove(qs.split[2].begin(), qs.split[2].end(), kTp),
                      qs.split[2].end());
    qs.split[3].clear();
    o.operands.push_back(qs);
    for (size_t k = 1; k < n.operands.size(); ++k) {
      const Shape &ks = n.operandShapes[k];
      Sharding s = Sharding::replicated(int(ks.size()));
      if (k <= 2 && ks.size() == 4) {
        s.split[0] = qs.split[0];
        if (divides(ks[1], qs.split[1]))
          s.split[1] = qs.split[1]; // grouped K/V heads split like Q's
        if (contains(qs.split[2], kCp))
          s.split[2] = {kCp};
      }
      o.operands.push_back(s);
    }
    Val out = q;
    out.s = qs;
    o.results.push_back(out);
    bool heads = contains(qs.split[1], kTp);
    bool ring = contains(qs.split[2], kCp);
    o.strategy = heads && ring ? "heads+ring"
                 : heads       ? "heads"
                 : ring        ? "ring"
                               : "replicated";
  }

  void norm(const OpNode &n, OpSharding &o) {
    const Shape &xs = n.operandShapes.empty() ? n.shape : n.operandShapes[0];
    Val x = n.operands.empty() ? rep(xs.size()) : reduced(operand(n, 0), xs);
    x.s = dropAxis(x.s, kTp);
    int axis = n.dims.empty() ? int(xs.size()) - 1 : int(n.dims[0]);
    for (int d = std::max(0, axis); d < x.s.rank(); ++d)
      x.s.split[d].clear();
    if (sp_)
      splitSeqOverTp(x, xs);
    o.operands.push_back(x.s);
    for (size_t k = 1; k < n.operands.size(); ++k)
      o.operands.push_back(
          Sharding::replicated(int(n.operandShapes[k].size())));
    o.results.push_back(x);
    o.strategy = x.s.uses(kTp) ? "sequence-parallel" : "replicated";
  }

  void loss(const OpNode &n, OpSharding &o) {
    if (n.operands.empty()) {
      fallback(n, o);
      return;
    }
    const Shape &ls = n.operandShapes[0];
    Val logits = reduced(operand(n, 0), ls);
    Sharding req = logits.s;
    bool vocab = false;
    if (n.op == "dlopt.cross_entropy" && ls.size() >= 2) {
      Axes &cls = req.split[ls.size() - 1];
      vocab = cls == Axes{kTp};
      if (!vocab)
        cls.clear();
      req = vocab ? req : dropAxis(req, kTp);
    } else {
      req = dropAxis(req, kTp);
    }
    o.operands.push_back(req);
    for (size_t k = 1; k < n.operands.size(); ++k) {
      const Shape &s2 = n.operandShapes[k];
      Sharding s = Sharding::replicated(int(s2.size()));
      for (size_t j = 0; j < s2.size() && j < ls.size(); ++j)
        if (s2[j] == ls[j] && !(vocab && j == ls.size() - 1))
          s.split[j] = req.split[j];
      o.operands.push_back(s);
    }
    Val out = rep(n.shape.size());
    if (n.shape.empty()) {
      // A mean over split rows: each rank holds its rows' share.
      for (size_t j = 0; j < req.split.size(); ++j)
        if (!(vocab && j == req.split.size() - 1))
          for (const std::string &a : req.split[j])
            out.s.partial.push_back(a);
    } else {
      for (size_t j = 0; j < n.shape.size() && j < ls.size(); ++j)
        if (n.shape[j] == ls[j])
          out.s.split[j] = req.split[j];
    }
    o.results.push_back(out);
    o.strategy = vocab ? "vocab-parallel" : "replicated";
  }

  void reduction(const OpNode &n, OpSharding &o) {
    const Shape &xs = n.operandShapes.empty() ? Shape{} : n.operandShapes[0];
    Val x = n.operands.empty() ? rep(0) : reduced(operand(n, 0), xs);
    const int r = int(xs.size());
    std::set<int> dims;
    for (int64_t d : n.dims)
      dims.insert(int(d < 0 ? d + r : d));
    const bool isMax = n.op == "dlopt.max";
    Val out = rep(n.shape.size());
    Sharding req = x.s;
    std::vector<std::string> partial;
    for (int d : dims)
      if (d >= 0 && d < r) {
        if (isMax)
          req.split[d].clear();
        else
          partial.insert(partial.end(), req.split[d].begin(),
                         req.split[d].end());
      }
    size_t od = 0;
    for (int d = 0; d < r; ++d) {
      bool red = dims.count(d) > 0;
      if (red && !n.keepDims)
        continue;
      if (od < n.shape.size() && !red) {
        out.s.split[od] = req.split[d];
        out.tags[od] = x.tags[d];
      }
      ++od;
    }
    out.s.partial = partial;
    o.operands.push_back(req);
    o.results.push_back(out);
    o.strategy = partial.empty() ? "elementwise" : "partial";
  }

  void transpose(const OpNode &n, OpSharding &o) {
    Val x = operand(n, 0); // linear: partial sums pass through
    Val out = rep(n.shape.size());
    for (size_t d = 0; d < n.dims.size() && d < n.shape.size(); ++d) {
      int j = int(n.dims[d]);
      if (j >= 0 && j < x.s.rank()) {
        out.s.split[d] = x.s.split[j];
        out.tags[d] = x.tags[j];
      }
    }
    out.s.partial = x.s.partial;
    o.operands.push_back(x.s);
    o.results.push_back(out);
    o.strategy = "elementwise";
  }

  /// Groups of input and output dims with equal products: a split moves to
  /// the leading (major) dim of its group when it divides it, and only a
  /// group's leading input dim may stay split.
  void reshape(const OpNode &n, OpSharding &o) {
    const Shape &in = n.operandShapes[0], &out = n.shape;
    Val x = operand(n, 0);
    Sharding req = x.s;
    Val res = rep(out.size());
    res.s.partial = x.s.partial;
    size_t i = 0, j = 0;
    while (i < in.size() || j < out.size()) {
      size_t i0 = i, j0 = j;
      int64_t pi = i < in.size() ? in[i++] : 1;
      int64_t po = j < out.size() ? out[j++] : 1;
      while (pi != po) {
        if (pi < po && i < in.size())
          pi *= in[i++];
        else if (po < pi && j < out.size())
          po *= out[j++];
        else
          break;
      }
      // Absorb trailing size-1 dims into this group.
      while (i < in.size() && in[i] == 1 && (j >= out.size() || out[j] != 1))
        ++i;
      while (j < out.size() && out[j] == 1 && (i >= in.size() || in[i] != 1))
        ++j;
      if (pi != po)
        break; // not a clean reshape: leave the rest replicated
      // The leading non-unit dims of the group.
      size_t li = i0, lo = j0;
      while (li + 1 < i && in[li] == 1)
        ++li;
      while (lo + 1 < j && out[lo] == 1)
        ++lo;
      for (size_t d = i0; d < i; ++d)
        if (d != li)
          req.split[d].clear();
      if (li < in.size() && lo < out.size() && li < i && lo < j) {
        const Axes &axes = req.split[li];
        if (!axes.empty() && divides(out[lo], axes))
          res.s.split[lo] = axes;
        else
          req.split[li].clear();
        res.tags[lo] = x.tags[li];
      }
    }
    o.operands.push_back(req);
    o.results.push_back(res);
    o.strategy = "elementwise";
  }

  /// Ops the template does not know: keep the input's data-parallel
  /// splits when shaped like the input, replicate the rest.
  void fallback(const OpNode &n, OpSharding &o) {
    Val out = rep(n.shape.size());
    Sharding req0;
    bool first = !n.operands.empty() && n.operandShapes[0] == n.shape;
    if (first) {
      Val x = reduced(operand(n, 0), n.operandShapes[0]);
      req0 = dropAxis(x.s, kTp);
      out.s = req0;
      out.tags = x.tags;
    }
    for (size_t k = 0; k < n.operands.size(); ++k)
      o.operands.push_back(k == 0 && first ? req0
                                           : Sharding::replicated(int(
                                                 n.operandShapes[k].size())));
    o.results.push_back(out);
    o.strategy = "replicated";
  }

  const GraphSummary &g_;
  int tp_, cp_, dp_;
  bool sp_;
  std::vector<std::vector<Val>> results_;
  std::vector<std::optional<Val>> args_;
};

} // namespace

std::vector<int> stagesByLayer(
    const GraphSummary &g,
    const std::vector<std::vector<int64_t>> &stageLayers) {
  std::map<int64_t, int> stageOfLayer;
  for (size_t s = 0; s < stageLayers.size(); ++s)
    for (int64_t l : stageLayers[s])
      stageOfLayer[l] = int(s);
  const int last = std::max(0, int(stageLayers.size()) - 1);
  std::vector<int> out(g.ops.size(), 0);
  bool seenLayer = false;
  for (const OpNode &n : g.ops) {
    if (n.layer >= 0) {
      seenLayer = true;
      auto it = stageOfLayer.find(n.layer);
      out[n.id] = it == stageOfLayer.end() ? 0 : it->second;
    } else {
      out[n.id] = seenLayer ? last : 0;
    }
  }
  return out;
}

void lowerTransformerSharding(
    const GraphSummary &g, const TrainingConfig &cfg,
    const std::vector<std::vector<int64_t>> &stageLayers, Plan &plan) {
  Lowering low(g, cfg);
  const std::vector<int> stage = stagesByLayer(g, stageLayers);
  plan.ops.clear();
  for (int i : g.forwardOps()) {
    const OpNode &n = g.ops[i];
    OpSharding o = low.lower(n);
    PlannedOp po;
    po.id = n.key();
    po.op = n.op;
    po.stage = stage[i];
    po.strategy = o.strategy;
    po.operands = std::move(o.operands);
    for (Val &v : o.results)
      po.results.push_back(std::move(v.s));
    plan.ops.push_back(std::move(po));
  }
  plan.args.clear();
  for (const ArgNode &a : g.args)
    plan.args.push_back({a.name, a.role, low.argSharding(a.index)});
}

} // namespace dlopt::planner
