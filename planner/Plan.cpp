//===- Plan.cpp - The plan and its JSON form ------------------------------===//
#include "planner/Plan.h"

#include "planner/PlanJson.h"
#include "planner/ReportUtil.h"
#include "planner/Search.h"

#include "runtime/support/FileRead.h"
#include "runtime/support/JsonLimits.h"

#include <cmath>
#include <limits>
#include <map>
#include <set>

namespace dlopt::planner {

//===----------------------------------------------------------------------===//
// Sharding
//===----------------------------------------------------------------------===//

bool Sharding::isReplicated() const {
  if (!partial.empty())
    return false;
  for (const auto &d : split)
    if (!d.empty())
      return false;
  return true;
}

bool Sharding::uses(std::string_view axis) const {
  for (const std::string &a : partial)
    if (a == axis)
      return true;
  return dimOf(axis) >= 0;
}

int Sharding::dimOf(std::string_view axis) const {
  for (size_t d = 0; d < split.size(); ++d)
    for (const std::string &a : split[d])
      if (a == axis)
        return int(d);
  return -1;
}

std::string Sharding::str() const {
  std::string s = "[";
  for (size_t d = 0; d < split.size(); ++d) {
    s += d ? ", " : "";
    if (split[d].empty())
      s += "-";
    for (size_t i = 0; i < split[d].size(); ++i)
      s += (i ? "." : "") + split[d][i];
  }
  s += "]";
  if (!partial.empty()) {
    s += " partial(";
    for (size_t i = 0; i < partial.size(); ++i)
      s += (i ? ", " : "") + partial[i];
    s += ")";
  }
  return s;
}

//===----------------------------------------------------------------------===//
// Plan
//===----------------------------------------------------------------------===//

const char *planKindName(PlanKind k) {
  return k == PlanKind::OpLevel ? "op-level" : "transformer";
}

const PlannedOp *Plan::op(int64_t id) const {
  // Ops are in program order with increasing ids (Plan::parse checks it).
  auto it = std::lower_bound(
      ops.begin(), ops.end(), id,
      [](const PlannedOp &o, int64_t v) { return o.id < v; });
  if (it != ops.end() && it->id == id)
    return &*it;
  for (const PlannedOp &o : ops) // built by hand out of order
    if (o.id == id)
      return &o;
  return nullptr;
}

const Sharding *Plan::resultSharding(int64_t id, int result) const {
  const PlannedOp *o = op(id);
  if (!o || result < 0 || result >= int(o->results.size()))
    return nullptr;
  return &o->results[result];
}

const Sharding *Plan::argSharding(std::string_view name) const {
  for (const PlannedArg &a : args)
    if (a.name == name)
      return &a.sharding;
  return nullptr;
}

std::optional<int> Plan::stageOf(int64_t id) const {
  const PlannedOp *o = op(id);
  if (!o)
    return std::nullopt;
  return o->stage;
}

Plan planFromConfig(PlanKind kind, const GraphSummary &g,
                    const Cluster &cluster, const TrainingConfig &cfg,
                    int64_t globalBatch, bool training, Precision precision,
                    ProcessLayout layout) {
  Plan p;
  p.kind = kind;
  p.training = training;
  p.cluster = cluster;
  p.mesh = Mesh::standard(cfg.pp, cfg.dp, std::max(1, cfg.cp), cfg.tp);
  p.globalBatch = globalBatch;
  p.microBatchSize = cfg.microBatchSize;
  p.numMicroBatches = cfg.numMicroBatches;
  p.schedule = cfg.schedule;
  p.virtualStages = cfg.virtualStages;
  p.zeroStage = cfg.zeroStage;
  p.recompute = cfg.recompute;
  p.sequenceParallel = cfg.sequenceParallel;
  p.optimizer = cfg.optimizer;
  p.layout = layout;
  p.stageLayerCounts = cfg.stageLayerCounts;
  ModelFingerprint &m = p.model;
  m.name = g.modelName;
  m.params = g.totalParams;
  const std::vector<int> forward = g.forwardOps();
  m.ops = int64_t(forward.size());
  for (const OpNode &n : g.ops)
    m.backwardOps += n.backward;
  m.updateOps = int64_t(g.ops.size()) - m.backwardOps - m.ops;
  m.dtype = g.dtype;
  m.precision = precisionName(precision);
  m.unfusedAttention = cfg.precision.unfusedAttention;
  m.eagerNorm = cfg.precision.eagerNorm;
  m.eagerRope = cfg.precision.eagerRope;
  if (kind == PlanKind::Transformer) {
    m.layers = g.numLayers;
    m.hidden = g.hidden;
    m.heads = g.heads;
    m.seq = g.seq;
    m.vocab = g.vocab > 0 ? g.vocab : 1;
  }
  return p;
}

FixSpec fixSpecOf(const Plan &p) {
  FixSpec f;
  f.dp = p.dp();
  f.tp = p.tp();
  f.pp = p.pp();
  f.mbs = p.microBatchSize;
  f.numMicroBatches = p.numMicroBatches;
  f.schedule = p.schedule;
  f.zero = p.zeroStage;
  f.recompute = p.recompute;
  if (p.kind == PlanKind::Transformer) {
    f.cp = p.cp();
    f.sp = p.sequenceParallel;
    if (p.schedule == PipelineSchedule::Interleaved1F1B)
      f.v = p.virtualStages;
    f.layout = p.layout;
  }
  return f;
}

//===----------------------------------------------------------------------===//
// Writing
//===----------------------------------------------------------------------===//

namespace {

using report::json;

const char *roleName(ArgNode::Role r) {
  switch (r) {
  case ArgNode::Role::Param:
    return "param";
  case ArgNode::Role::Input:
    return "input";
  case ArgNode::Role::State:
    return "state";
  case ArgNode::Role::Other:
    break;
  }
  return "other";
}

json shardingJson(const Sharding &s) {
  json split = json::array();
  for (const auto &d : s.split)
    split.push_back(d);
  return json{{"split", split}, {"partial", s.partial}};
}

} // namespace

report::json planJson(const Plan &p) {
  json j = report::jsonEnvelope(planKindName(p.kind), kPlanFileVersion,
                                p.training);
  json model = {{"name", p.model.name},
                {"params", p.model.params},
                {"ops", p.model.ops},
                {"backward_ops", p.model.backwardOps},
                {"update_ops", p.model.updateOps},
                {"dtype", p.model.dtype},
                {"precision", p.model.precision}};
  if (p.model.unfusedAttention)
    model["attention_kernel"] = "unfused";
  if (p.model.eagerNorm || p.model.eagerRope)
    model["eager_kernels"] =
        eagerKernelsName(p.model.eagerNorm, p.model.eagerRope);
  if (p.kind == PlanKind::Transformer) {
    model["layers"] = p.model.layers;
    model["hidden"] = p.model.hidden;
    model["heads"] = p.model.heads;
    model["seq"] = p.model.seq;
    model["vocab"] = p.model.vocab;
  }
  j["model"] = model;
  j["cluster"] = report::jsonCluster(p.cluster);
  json axes = json::array(), shape = json::array();
  for (const MeshAxis &a : p.mesh.axes()) {
    axes.push_back(a.name);
    shape.push_back(a.size);
  }
  j["mesh"] = {{"axes", axes},
               {"shape", shape},
               {"rank_formula", p.mesh.rankFormula()}};
  j["global_batch"] = p.globalBatch;
  json cfg = {{"micro_batch_size", p.microBatchSize},
              {"num_micro_batches", p.numMicroBatches},
              {"schedule", scheduleKey(p.schedule)},
              {"virtual_stages", p.virtualStages},
              {"zero_stage", p.zeroStage},
              {"recompute", recomputeName(p.recompute)},
              {"sequence_parallel", p.sequenceParallel},
              {"optimizer", optimizerName(p.optimizer)},
              {"layout", p.layout == ProcessLayout::InGraph ? "in-graph"
                                                            : "between-graph"}};
  if (!p.stageLayerCounts.empty())
    cfg["stage_layers"] = p.stageLayerCounts;
  j["config"] = cfg;
  json args = json::array();
  for (const PlannedArg &a : p.args)
    args.push_back({{"name", a.name},
                    {"role", roleName(a.role)},
                    {"sharding", shardingJson(a.sharding)}});
  j["args"] = args;
  json ops = json::array();
  for (const PlannedOp &o : p.ops) {
    json operands = json::array(), results = json::array();
    for (const Sharding &s : o.operands)
      operands.push_back(shardingJson(s));
    for (const Sharding &s : o.results)
      results.push_back(shardingJson(s));
    ops.push_back({{"id", o.id},
                   {"op", o.op},
                   {"stage", o.stage},
                   {"strategy", o.strategy},
                   {"operands", operands},
                   {"results", results}});
  }
  j["ops"] = ops;
  return j;
}

std::string Plan::toJson() const { return planJson(*this).dump(2) + "\n"; }

//===----------------------------------------------------------------------===//
// Reading
//===----------------------------------------------------------------------===//

namespace {

using rjson = nlohmann::json;

/// Field access with messages "<source>: <path>: <what>".
struct Reader {
  std::string source;
  Status error(const std::string &path, const std::string &msg) const {
    return Status::error(source + ": " + (path.empty() ? "" : path + ": ") +
                         msg);
  }
  static std::string at(const std::string &path, const std::string &key) {
    return path.empty() ? key : path + "." + key;
  }
  static std::string at(const std::string &path, size_t i) {
    return path + "[" + std::to_string(i) + "]";
  }
  Expected<const rjson *> field(const rjson &obj, const std::string &path,
                                const char *key) const {
    if (!obj.is_object())
      return error(path, "expected an object, got " + obj.dump());
    if (!obj.contains(key))
      return error(path, std::string("missing required field '") + key + "'");
    return &obj[key];
  }
  template <class Ok>
  Expected<const rjson *> typed(const rjson &obj, const std::string &path,
                                const char *key, Ok ok,
                                const char *what) const {
    auto f = field(obj, path, key);
    if (!f)
      return f.status();
    if (!ok(**f))
      return error(at(path, key),
                   std::string("expected ") + what + ", got " + (*f)->dump());
    return f;
  }
  Expected<int64_t> integer(const rjson &obj, const std::string &path,
                            const char *key, int64_t min) const {
    auto f = typed(
        obj, path, key, [](const rjson &v) { return v.is_number_integer(); },
        "an integer");
    if (!f)
      return f.status();
    int64_t i = (*f)->get<int64_t>();
    if (i < min)
      return error(at(path, key), "expected an integer >= " +
                                      std::to_string(min) + ", got " +
                                      std::to_string(i));
    // Degrees, batch sizes and ids all fit an int.
    const int64_t max = std::numeric_limits<int>::max();
    if (i > max)
      return error(at(path, key), "expected an integer <= " +
                                      std::to_string(max) + ", got " +
                                      std::to_string(i));
    return i;
  }
  Expected<double> number(const rjson &obj, const std::string &path,
                          const char *key) const {
    auto f = typed(
        obj, path, key, [](const rjson &v) { return v.is_number(); },
        "a number");
    if (!f)
      return f.status();
    return (*f)->get<double>();
  }
  Expected<std::string> string(const rjson &obj, const std::string &path,
                               const char *key) const {
    auto f = typed(
        obj, path, key, [](const rjson &v) { return v.is_string(); },
        "a string");
    if (!f)
      return f.status();
    return (*f)->get<std::string>();
  }
  Expected<bool> boolean(const rjson &obj, const std::string &path,
                         const char *key) const {
    auto f = typed(
        obj, path, key, [](const rjson &v) { return v.is_boolean(); },
        "true or false");
    if (!f)
      return f.status();
    return (*f)->get<bool>();
  }
  Expected<const rjson *> array(const rjson &obj, const std::string &path,
                                const char *key) const {
    return typed(
        obj, path, key, [](const rjson &v) { return v.is_array(); },
        "an array");
  }
  Expected<std::vector<std::string>> strings(const rjson &v,
                                             const std::string &path) const {
    if (!v.is_array())
      return error(path, "expected an array of strings, got " + v.dump());
    std::vector<std::string> out;
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_string())
        return error(at(path, i), "expected a string, got " + v[i].dump());
      out.push_back(v[i].get<std::string>());
    }
    return out;
  }
};

#define PLAN_ASSIGN(lhs, expr)                                                 \
  do {                                                                         \
    auto _v = (expr);                                                          \
    if (!_v)                                                                   \
      return _v.status();                                                      \
    lhs = *_v;                                                                 \
  } while (0)

/// {"split": [[axes] per dim], "partial": [axes]}: every axis exists in the
/// mesh and is used at most once.
Expected<Sharding> parseSharding(const Reader &rd, const rjson &j,
                                 const std::string &path, const Mesh &mesh) {
  Sharding s;
  const rjson *split = nullptr;
  PLAN_ASSIGN(split, rd.array(j, path, "split"));
  std::set<std::string> used;
  auto use = [&](const std::string &axis,
                 const std::string &where) -> Status {
    if (!mesh.hasAxis(axis))
      return rd.error(where, "unknown mesh axis \"" + axis + "\" (the mesh has " +
                                 mesh.str() + ")");
    if (!used.insert(axis).second)
      return rd.error(where, "mesh axis \"" + axis +
                                 "\" is used twice in one sharding");
    return Status::ok();
  };
  for (size_t d = 0; d < split->size(); ++d) {
    std::string dp = Reader::at(Reader::at(path, "split"), d);
    std::vector<std::string> axes;
    PLAN_ASSIGN(axes, rd.strings((*split)[d], dp));
    for (const std::string &a : axes)
      DLOPT_RETURN_IF_ERROR(use(a, dp));
    s.split.push_back(std::move(axes));
  }
  const rjson *partial = nullptr;
  PLAN_ASSIGN(partial, rd.field(j, path, "partial"));
  PLAN_ASSIGN(s.partial, rd.strings(*partial, Reader::at(path, "partial")));
  for (const std::string &a : s.partial)
    DLOPT_RETURN_IF_ERROR(use(a, Reader::at(path, "partial")));
  return s;
}

Expected<std::vector<Sharding>> parseShardings(const Reader &rd,
                                               const rjson &obj,
                                               const std::string &path,
                                               const char *key,
                                               const Mesh &mesh) {
  const rjson *arr = nullptr;
  PLAN_ASSIGN(arr, rd.array(obj, path, key));
  std::vector<Sharding> out;
  for (size_t i = 0; i < arr->size(); ++i) {
    Sharding s;
    PLAN_ASSIGN(s, parseSharding(rd, (*arr)[i],
                                 Reader::at(Reader::at(path, key), i), mesh));
    out.push_back(std::move(s));
  }
  return out;
}

Status parseModel(const Reader &rd, const rjson &j, Plan &p) {
  const rjson *m = nullptr;
  PLAN_ASSIGN(m, rd.field(j, "", "model"));
  const std::string mo = "model";
  ModelFingerprint &f = p.model;
  PLAN_ASSIGN(f.name, rd.string(*m, mo, "name"));
  PLAN_ASSIGN(f.params, rd.number(*m, mo, "params"));
  PLAN_ASSIGN(f.ops, rd.integer(*m, mo, "ops", 0));
  PLAN_ASSIGN(f.backwardOps, rd.integer(*m, mo, "backward_ops", 0));
  PLAN_ASSIGN(f.updateOps, rd.integer(*m, mo, "update_ops", 0));
  PLAN_ASSIGN(f.dtype, rd.string(*m, mo, "dtype"));
  PLAN_ASSIGN(f.precision, rd.string(*m, mo, "precision"));
  if (!parsePrecision(f.precision))
    return rd.error("model.precision",
                    "unknown precision \"" + f.precision + "\"");
  if (m->contains("attention_kernel")) {
    std::string k;
    PLAN_ASSIGN(k, rd.string(*m, mo, "attention_kernel"));
    if (k != "fused" && k != "unfused")
      return rd.error("model.attention_kernel",
                      "expected \"fused\" or \"unfused\", got \"" + k + "\"");
    f.unfusedAttention = k == "unfused";
  }
  if (m->contains("eager_kernels")) {
    std::string k;
    PLAN_ASSIGN(k, rd.string(*m, mo, "eager_kernels"));
    if (!parseEagerKernels(k, f.eagerNorm, f.eagerRope))
      return rd.error("model.eager_kernels",
                      "expected \"norm\", \"rope\" or \"norm,rope\", got \"" +
                          k.substr(0, 40) + "\"");
  }
  if (p.kind == PlanKind::Transformer) {
    PLAN_ASSIGN(f.layers, rd.integer(*m, mo, "layers", 1));
    PLAN_ASSIGN(f.hidden, rd.integer(*m, mo, "hidden", 1));
    PLAN_ASSIGN(f.heads, rd.integer(*m, mo, "heads", 1));
    PLAN_ASSIGN(f.seq, rd.integer(*m, mo, "seq", 1));
    PLAN_ASSIGN(f.vocab, rd.integer(*m, mo, "vocab", 1));
  }
  return Status::ok();
}

Status parseMesh(const Reader &rd, const rjson &j, Plan &p) {
  const rjson *m = nullptr;
  PLAN_ASSIGN(m, rd.field(j, "", "mesh"));
  std::vector<std::string> names;
  const rjson *axes = nullptr;
  PLAN_ASSIGN(axes, rd.field(*m, "mesh", "axes"));
  PLAN_ASSIGN(names, rd.strings(*axes, "mesh.axes"));
  if (names != std::vector<std::string>{"pp", "dp", "cp", "tp"})
    return rd.error("mesh.axes",
                    "expected [\"pp\", \"dp\", \"cp\", \"tp\"] (the planner's "
                    "rank order), got " +
                        axes->dump());
  const rjson *shape = nullptr;
  PLAN_ASSIGN(shape, rd.array(*m, "mesh", "shape"));
  if (shape->size() != names.size())
    return rd.error("mesh.shape", std::to_string(shape->size()) +
                                      " sizes for " +
                                      std::to_string(names.size()) + " axes");
  std::vector<MeshAxis> ax;
  for (size_t i = 0; i < names.size(); ++i) {
    const rjson &v = (*shape)[i];
    std::string path = Reader::at("mesh.shape", i);
    if (!v.is_number_integer() || v.get<int64_t>() < 1 ||
        v.get<int64_t>() > std::numeric_limits<int>::max())
      return rd.error(path, "expected an integer >= 1, got " + v.dump());
    ax.push_back({names[i], int(v.get<int64_t>())});
  }
  auto mesh = Mesh::make(std::move(ax));
  if (!mesh)
    return rd.error("mesh", mesh.status().message());
  p.mesh = *mesh;
  if (p.mesh.numDevices() != p.cluster.numDevices())
    return rd.error("mesh", "pp*dp*cp*tp = " +
                                std::to_string(p.mesh.numDevices()) +
                                " but the cluster has " +
                                std::to_string(p.cluster.numDevices()) +
                                " devices");
  return Status::ok();
}

Status parseConfig(const Reader &rd, const rjson &j, Plan &p) {
  const rjson *cfgp = nullptr;
  PLAN_ASSIGN(cfgp, rd.field(j, "", "config"));
  const rjson &cfg = *cfgp;
  const std::string c = "config";
  int64_t v = 0;
  std::string s;
  PLAN_ASSIGN(p.microBatchSize, rd.integer(cfg, c, "micro_batch_size", 1));
  PLAN_ASSIGN(p.numMicroBatches, rd.integer(cfg, c, "num_micro_batches", 1));
  PLAN_ASSIGN(s, rd.string(cfg, c, "schedule"));
  auto sched = parseSchedule(s);
  if (!sched)
    return rd.error("config.schedule", "unknown schedule \"" + s + "\"");
  p.schedule = *sched;
  PLAN_ASSIGN(v, rd.integer(cfg, c, "virtual_stages", 1));
  p.virtualStages = int(v);
  PLAN_ASSIGN(v, rd.integer(cfg, c, "zero_stage", 0));
  if (v > 3)
    return rd.error("config.zero_stage",
                    "expected 0 to 3, got " + std::to_string(v));
  p.zeroStage = int(v);
  PLAN_ASSIGN(s, rd.string(cfg, c, "recompute"));
  auto rc = parseRecompute(s);
  if (!rc)
    return rd.error("config.recompute", "unknown policy \"" + s + "\"");
  p.recompute = *rc;
  PLAN_ASSIGN(p.sequenceParallel, rd.boolean(cfg, c, "sequence_parallel"));
  PLAN_ASSIGN(s, rd.string(cfg, c, "optimizer"));
  bool known = false;
  for (Optimizer o : {Optimizer::SGD, Optimizer::Momentum, Optimizer::Adam})
    if (s == optimizerName(o)) {
      p.optimizer = o;
      known = true;
    }
  if (!known)
    return rd.error("config.optimizer",
                    "expected \"sgd\", \"momentum\" or \"adam\", got \"" + s +
                        "\"");
  PLAN_ASSIGN(s, rd.string(cfg, c, "layout"));
  auto layout = parseLayout(s);
  if (!layout)
    return rd.error("config.layout", "unknown process layout \"" + s + "\"");
  p.layout = *layout;
  if (cfg.contains("stage_layers")) {
    const rjson &sl = cfg["stage_layers"];
    if (!sl.is_array() || int(sl.size()) != p.pp())
      return rd.error("config.stage_layers",
                      "expected an array of pp = " + std::to_string(p.pp()) +
                          " layer counts, got " + sl.dump());
    for (size_t i = 0; i < sl.size(); ++i) {
      if (!sl[i].is_number_integer() || sl[i].get<int64_t>() < 1 ||
          sl[i].get<int64_t>() > std::numeric_limits<int>::max())
        return rd.error(Reader::at("config.stage_layers", i),
                        "expected an integer >= 1, got " + sl[i].dump());
      p.stageLayerCounts.push_back(sl[i].get<int64_t>());
    }
  }

  // The choices must agree with each other and with the mesh.
  if (p.virtualStages > 1 && p.schedule != PipelineSchedule::Interleaved1F1B)
    return rd.error("config.virtual_stages",
                    std::to_string(p.virtualStages) +
                        " virtual stages need the interleaved schedule, got \"" +
                        scheduleKey(p.schedule) + "\"");
  if (p.schedule == PipelineSchedule::Interleaved1F1B && p.virtualStages < 2)
    return rd.error("config.schedule",
                    "\"interleaved\" needs virtual_stages >= 2, got " +
                        std::to_string(p.virtualStages));
  if (p.sequenceParallel && p.tp() == 1)
    return rd.error("config.sequence_parallel",
                    "sequence parallelism needs tp > 1");
  int64_t samples = int64_t(p.dp()) * p.microBatchSize * p.numMicroBatches;
  if (samples != p.globalBatch)
    return rd.error("config", "dp*micro_batch_size*num_micro_batches = " +
                                  std::to_string(samples) +
                                  " but the global batch is " +
                                  std::to_string(p.globalBatch));
  if (p.zeroStage > 0 && !p.training)
    return rd.error("config.zero_stage",
                    "zero " + std::to_string(p.zeroStage) +
                        " needs a training plan");
  if (p.kind == PlanKind::OpLevel) {
    if (p.recompute != RecomputePolicy::None)
      return rd.error("config.recompute",
                      std::string("op-level plans use \"none\", got \"") +
                          recomputeName(p.recompute) + "\"");
    if (p.cp() != 1)
      return rd.error("mesh.shape", "op-level plans have cp = 1, got " +
                                        std::to_string(p.cp()));
    if (p.sequenceParallel)
      return rd.error("config.sequence_parallel",
                      "op-level plans do not use sequence parallelism");
    if (p.zeroStage > 0 && p.dp() == 1)
      return rd.error("config.zero_stage",
                      "zero " + std::to_string(p.zeroStage) +
                          " needs a training plan with dp > 1");
  }
  return Status::ok();
}

Expected<ArgNode::Role> parseRole(const Reader &rd, const std::string &s,
                                  const std::string &path) {
  for (ArgNode::Role r : {ArgNode::Role::Param, ArgNode::Role::Input,
                          ArgNode::Role::State, ArgNode::Role::Other})
    if (s == roleName(r))
      return r;
  return rd.error(path, "expected \"param\", \"input\", \"state\" or "
                        "\"other\", got \"" +
                            s + "\"");
}

Status parseValues(const Reader &rd, const rjson &j, Plan &p) {
  const rjson *args = nullptr;
  PLAN_ASSIGN(args, rd.array(j, "", "args"));
  std::set<std::string> names;
  for (size_t i = 0; i < args->size(); ++i) {
    const rjson &a = (*args)[i];
    std::string at = Reader::at("args", i);
    PlannedArg pa;
    PLAN_ASSIGN(pa.name, rd.string(a, at, "name"));
    if (!names.insert(pa.name).second)
      return rd.error(at + ".name", "argument \"" + pa.name +
                                        "\" is listed twice");
    std::string role;
    PLAN_ASSIGN(role, rd.string(a, at, "role"));
    PLAN_ASSIGN(pa.role, parseRole(rd, role, at + ".role"));
    const rjson *sh = nullptr;
    PLAN_ASSIGN(sh, rd.field(a, at, "sharding"));
    PLAN_ASSIGN(pa.sharding, parseSharding(rd, *sh, at + ".sharding", p.mesh));
    p.args.push_back(std::move(pa));
  }

  const rjson *ops = nullptr;
  PLAN_ASSIGN(ops, rd.array(j, "", "ops"));
  if (int64_t(ops->size()) != p.model.ops)
    return rd.error("ops", std::to_string(ops->size()) +
                               " entries, but model.ops is " +
                               std::to_string(p.model.ops));
  for (size_t i = 0; i < ops->size(); ++i) {
    const rjson &o = (*ops)[i];
    std::string at = Reader::at("ops", i);
    PlannedOp po;
    PLAN_ASSIGN(po.id, rd.integer(o, at, "id", 0));
    PLAN_ASSIGN(po.op, rd.string(o, at, "op"));
    int64_t stage = 0;
    PLAN_ASSIGN(stage, rd.integer(o, at, "stage", 0));
    if (stage >= p.pp())
      return rd.error(at + ".stage", "stage " + std::to_string(stage) +
                                         " of pp = " + std::to_string(p.pp()));
    po.stage = int(stage);
    PLAN_ASSIGN(po.strategy, rd.string(o, at, "strategy"));
    PLAN_ASSIGN(po.operands, parseShardings(rd, o, at, "operands", p.mesh));
    PLAN_ASSIGN(po.results, parseShardings(rd, o, at, "results", p.mesh));
    if (!p.ops.empty() && po.id <= p.ops.back().id)
      return rd.error(at + ".id", "ids must increase, got " +
                                      std::to_string(po.id) + " after " +
                                      std::to_string(p.ops.back().id));
    p.ops.push_back(std::move(po));
  }
  return Status::ok();
}

} // namespace

Expected<Plan> Plan::parse(std::string_view text, std::string_view source) {
  Reader rd{std::string(source)};
  rjson j;
  {
    auto parsed = rt::parseJsonBounded<rjson>(text);
    if (!parsed)
      return Status::error(std::string(source) + ": " +
                           parsed.status().message());
    j = parsed.take();
  }
  if (!j.is_object())
    return rd.error("", "expected a JSON object (a dlopt plan file)");
  std::string format;
  PLAN_ASSIGN(format, rd.string(j, "", "format"));
  if (format != "dlopt-plan")
    return rd.error("format",
                    "expected \"dlopt-plan\", got \"" + format + "\"");
  int64_t version = 0;
  PLAN_ASSIGN(version, rd.integer(j, "", "version", 0));
  if (version != kPlanFileVersion)
    return rd.error("version",
                    "this dlopt reads plan files of version " +
                        std::to_string(kPlanFileVersion) + ", got version " +
                        std::to_string(version) +
                        " (re-plan with this dlopt-compile's --dry-run "
                        "--format json)");
  Plan p;
  std::string kind;
  PLAN_ASSIGN(kind, rd.string(j, "", "kind"));
  if (kind == "op-level")
    p.kind = PlanKind::OpLevel;
  else if (kind != "transformer")
    return rd.error("kind", "expected \"transformer\" or \"op-level\", got \"" +
                                kind + "\"");
  std::string mode;
  PLAN_ASSIGN(mode, rd.string(j, "", "mode"));
  if (mode != "training" && mode != "forward")
    return rd.error("mode", "expected \"training\" or \"forward\", got \"" +
                                mode + "\"");
  p.training = mode == "training";
  DLOPT_RETURN_IF_ERROR(parseModel(rd, j, p));

  const rjson *cl = nullptr;
  PLAN_ASSIGN(cl, rd.field(j, "", "cluster"));
  int64_t devices = 0;
  PLAN_ASSIGN(devices, rd.integer(*cl, "cluster", "devices", 1));
  const rjson *def = nullptr;
  PLAN_ASSIGN(def, rd.field(*cl, "cluster", "definition"));
  auto cluster = parseCluster(def->dump(), ClusterFormat::Json,
                              std::string(source) + ": cluster.definition");
  if (!cluster)
    return cluster.status();
  p.cluster = *cluster;
  if (devices != p.cluster.numDevices())
    return rd.error("cluster.devices",
                    std::to_string(devices) +
                        " devices, but the embedded definition has " +
                        std::to_string(p.cluster.numDevices()));
  DLOPT_RETURN_IF_ERROR(parseMesh(rd, j, p));
  PLAN_ASSIGN(p.globalBatch, rd.integer(j, "", "global_batch", 1));
  DLOPT_RETURN_IF_ERROR(parseConfig(rd, j, p));
  DLOPT_RETURN_IF_ERROR(parseValues(rd, j, p));
  // j["report"] holds the predictions the dry run printed; never read.
  return p;
}

Expected<Plan> Plan::load(const std::string &path) {
  Expected<std::string> text = rt::readTextFileLimited(path, "plan file");
  if (!text)
    return text.status();
  return parse(*text, path);
}

//===----------------------------------------------------------------------===//
// Checks against the model and the re-solved plan
//===----------------------------------------------------------------------===//

namespace {

void addWhy(std::string &why, const std::string &what) {
  why += (why.empty() ? "" : "; ") + what;
}

void compareCounts(std::string &why, const char *what, int64_t plan,
                   int64_t model) {
  if (plan != model)
    addWhy(why, std::string(what) + " " + std::to_string(plan) +
                    " in the plan, " + std::to_string(model) +
                    " in the model");
}

size_t rankOf(const std::vector<int64_t> &shape) { return shape.size(); }

} // namespace

Status checkPlanMatchesModel(const Plan &p, const GraphSummary &g) {
  std::string why;
  const std::vector<int> forward = g.forwardOps();
  if (p.kind == PlanKind::Transformer) {
    compareCounts(why, "layers", p.model.layers, g.numLayers);
    compareCounts(why, "hidden", p.model.hidden, g.hidden);
    compareCounts(why, "heads", p.model.heads, g.heads);
    compareCounts(why, "seq", p.model.seq, g.seq);
    compareCounts(why, "vocab", p.model.vocab, g.vocab > 0 ? g.vocab : 1);
  } else {
    compareCounts(why, "ops", p.model.ops, int64_t(forward.size()));
    int64_t backward = 0, update = 0;
    for (const OpNode &n : g.ops)
      backward += n.backward;
    update = int64_t(g.ops.size()) - backward - int64_t(forward.size());
    compareCounts(why, "backward ops", p.model.backwardOps, backward);
    compareCounts(why, "update ops", p.model.updateOps, update);
  }
  if (std::abs(p.model.params - g.totalParams) > 0.5)
    addWhy(why, "parameters " + std::to_string(int64_t(p.model.params)) +
                    " in the plan, " + std::to_string(int64_t(g.totalParams)) +
                    " in the model");
  if (why.empty() && p.kind == PlanKind::Transformer)
    compareCounts(why, "ops", p.model.ops, int64_t(forward.size()));
  if (why.empty()) {
    // Every planned op is the same op in the model, with as many shardings
    // as it has operands and results, each of the value's rank.
    std::map<int64_t, int> byKey;
    for (int i : forward)
      byKey[g.ops[i].key()] = i;
    for (size_t i = 0; i < p.ops.size() && why.empty(); ++i) {
      const PlannedOp &po = p.ops[i];
      auto it = byKey.find(po.id);
      std::string here = "planned op " + std::to_string(i) + " is #" +
                         std::to_string(po.id) + " " + po.op + " in the plan";
      if (it == byKey.end()) {
        addWhy(why, here + ", but the model has no forward op #" +
                        std::to_string(po.id));
        break;
      }
      const OpNode &n = g.ops[it->second];
      if (po.op != n.op) {
        addWhy(why, here + ", #" + std::to_string(n.key()) + " " + n.op +
                        " in the model");
        break;
      }
      if (po.operands.size() != n.operands.size() ||
          int(po.results.size()) != n.numResults) {
        addWhy(why, here + " with " + std::to_string(po.operands.size()) +
                        " operand and " + std::to_string(po.results.size()) +
                        " result shardings; the model's op has " +
                        std::to_string(n.operands.size()) + " and " +
                        std::to_string(n.numResults));
        break;
      }
      for (size_t k = 0; k < po.operands.size(); ++k)
        if (size_t(po.operands[k].rank()) != rankOf(n.operandShapes[k])) {
          addWhy(why, here + ": operand " + std::to_string(k) +
                          " has rank " +
                          std::to_string(n.operandShapes[k].size()) +
                          ", its sharding " + po.operands[k].str() + " " +
                          std::to_string(po.operands[k].rank()));
          break;
        }
      if (!why.empty())
        break;
      if (!po.results.empty() && size_t(po.results[0].rank()) != n.shape.size())
        addWhy(why, here + ": result 0 has rank " +
                        std::to_string(n.shape.size()) + ", its sharding " +
                        po.results[0].str() + " " +
                        std::to_string(po.results[0].rank()));
    }
  }
  if (why.empty()) {
    for (const PlannedArg &a : p.args) {
      const ArgNode *m = nullptr;
      for (const ArgNode &x : g.args)
        if (x.name == a.name)
          m = &x;
      if (!m) {
        addWhy(why, "argument \"" + a.name + "\" is not in the model");
        break;
      }
      if (size_t(a.sharding.rank()) != m->shape.size()) {
        addWhy(why, "argument \"" + a.name + "\" has rank " +
                        std::to_string(m->shape.size()) + ", its sharding " +
                        a.sharding.str() + " " +
                        std::to_string(a.sharding.rank()));
        break;
      }
    }
  }
  if (why.empty())
    return Status::ok();
  return Status::error("the plan was made for another model: " + why);
}

std::string comparePlans(const Plan &file, const Plan &now) {
  std::vector<std::string> diffs;
  size_t n = 0;
  auto note = [&](const std::string &d) {
    if (diffs.size() < 3)
      diffs.push_back(d);
    ++n;
  };
  auto list = [](const std::vector<Sharding> &ss) {
    std::string s;
    for (const Sharding &x : ss)
      s += (s.empty() ? "" : ", ") + x.str();
    return "(" + s + ")";
  };
  for (const PlannedOp &po : file.ops) {
    const PlannedOp *c = now.op(po.id);
    // Built piecewise: "#" + std::string trips GCC 12's -Wrestrict false
    // positive (PR 105329).
    std::string d = "#";
    d += std::to_string(po.id);
    d += ' ';
    d += po.op;
    d += ": ";
    if (!c) {
      note(d + po.strategy + " in the plan, not planned now");
      continue;
    }
    if (c->strategy != po.strategy) {
      note(d + po.strategy + " in the plan, " + c->strategy + " now");
      continue;
    }
    if (c->operands != po.operands)
      note(d + "operands " + list(po.operands) + " in the plan, " +
           list(c->operands) + " now");
    if (c->results != po.results)
      note(d + "results " + list(po.results) + " in the plan, " +
           list(c->results) + " now");
    if (c->stage != po.stage)
      note(d + "stage " + std::to_string(po.stage) + " in the plan, " +
           std::to_string(c->stage) + " now");
  }
  for (const PlannedArg &a : file.args) {
    const Sharding *s = now.argSharding(a.name);
    std::string got = s ? s->str() : "not planned";
    if (!s || *s != a.sharding)
      note("argument " + a.name + ": " + a.sharding.str() + " in the plan, " +
           got + " now");
  }
  if (n == 0)
    return "";
  std::string out = "the re-solved sharding differs from the plan file in " +
                    std::to_string(n) + " place" + (n == 1 ? "" : "s") + " (";
  for (size_t i = 0; i < diffs.size(); ++i)
    out += (i ? "; " : "") + diffs[i];
  out += n > diffs.size() ? "; ...)" : ")";
  return out + "; the report shows the re-solved plan (the file was "
               "edited, or the calibration or the solver differs from the "
               "one that wrote it)";
}

} // namespace dlopt::planner
