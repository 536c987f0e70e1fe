//===- PlanFile.cpp - Reading a dlopt plan file back ----------------------===//
#include "planner/PlanFile.h"

#include "runtime/support/FileRead.h"
#include "runtime/support/JsonLimits.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <fstream>
#include <sstream>

namespace dlopt::planner {
namespace {

using json = nlohmann::json;

struct Reader {
  std::string source;
  Status error(const std::string &path, const std::string &msg) const {
    return Status::error(source + ": " + (path.empty() ? "" : path + ": ") +
                         msg);
  }
  Expected<const json *> field(const json &obj, const std::string &path,
                               const char *key) const {
    if (!obj.is_object() || !obj.contains(key))
      return error(path, std::string("missing required field '") + key + "'");
    return &obj[key];
  }
  /// The field `key` when `ok(value)`, else "<path.key>: expected <what>,
  /// got <value>".
  template <class Ok>
  Expected<const json *> typed(const json &obj, const std::string &path,
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
  static std::string at(const std::string &path, const char *key) {
    return path.empty() ? key : path + "." + key;
  }
  Expected<int64_t> integer(const json &obj, const std::string &path,
                            const char *key, int64_t min) const {
    auto f = typed(
        obj, path, key, [](const json &v) { return v.is_number_integer(); },
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
  Expected<double> number(const json &obj, const std::string &path,
                          const char *key) const {
    auto f = typed(
        obj, path, key, [](const json &v) { return v.is_number(); },
        "a number");
    if (!f)
      return f.status();
    return (*f)->get<double>();
  }
  Expected<std::string> string(const json &obj, const std::string &path,
                               const char *key) const {
    auto f = typed(
        obj, path, key, [](const json &v) { return v.is_string(); },
        "a string");
    if (!f)
      return f.status();
    return (*f)->get<std::string>();
  }
};

#define PF_ASSIGN(lhs, expr)                                                   \
  do {                                                                         \
    auto _v = (expr);                                                          \
    if (!_v)                                                                   \
      return _v.status();                                                      \
    lhs = *_v;                                                                 \
  } while (0)

} // namespace

const char *planKindName(PlanKind k) {
  return k == PlanKind::OpLevel ? "op-level" : "transformer";
}

int planFileVersion(PlanKind k) { return k == PlanKind::OpLevel ? 1 : 2; }

namespace {

/// The "config" choices both kinds of plan make: dp, tp, pp, the
/// micro-batch size and count, the schedule and the ZeRO stage. Returns the
/// config object for the kind's own choices.
Expected<const json *> parseSharedConfig(const Reader &rd, const json &j,
                                         FixSpec &f) {
  const json *cfgp = nullptr;
  PF_ASSIGN(cfgp, rd.field(j, "", "config"));
  const json &cfg = *cfgp;
  const std::string c = "config";
  int64_t v = 0;
  PF_ASSIGN(v, rd.integer(cfg, c, "dp", 1));
  f.dp = int(v);
  PF_ASSIGN(v, rd.integer(cfg, c, "tp", 1));
  f.tp = int(v);
  PF_ASSIGN(v, rd.integer(cfg, c, "pp", 1));
  f.pp = int(v);
  PF_ASSIGN(v, rd.integer(cfg, c, "micro_batch_size", 1));
  f.mbs = v;
  PF_ASSIGN(v, rd.integer(cfg, c, "num_micro_batches", 1));
  f.numMicroBatches = v;
  std::string s;
  PF_ASSIGN(s, rd.string(cfg, c, "schedule"));
  f.schedule = parseSchedule(s);
  if (!f.schedule)
    return rd.error("config.schedule", "unknown schedule \"" + s + "\"");
  PF_ASSIGN(v, rd.integer(cfg, c, "zero_stage", 0));
  if (v > 3)
    return rd.error("config.zero_stage",
                    "expected 0 to 3, got " + std::to_string(v));
  f.zero = int(v);
  return cfgp;
}

/// The transformer plan's "model" and "config" (Report.cpp writes them).
Status parseTransformer(const Reader &rd, const json &j, LoadedPlan &p) {
  const json *model = nullptr;
  PF_ASSIGN(model, rd.field(j, "", "model"));
  PF_ASSIGN(p.modelName, rd.string(*model, "model", "name"));
  PF_ASSIGN(p.layers, rd.integer(*model, "model", "layers", 1));
  PF_ASSIGN(p.hidden, rd.integer(*model, "model", "hidden", 1));
  PF_ASSIGN(p.heads, rd.integer(*model, "model", "heads", 1));
  PF_ASSIGN(p.seq, rd.integer(*model, "model", "seq", 1));
  PF_ASSIGN(p.vocab, rd.integer(*model, "model", "vocab", 1));
  PF_ASSIGN(p.precision, rd.string(*model, "model", "precision"));
  PF_ASSIGN(p.params, rd.number(*model, "model", "params"));

  const json *cfg = nullptr;
  PF_ASSIGN(cfg, parseSharedConfig(rd, j, p.fix));
  const std::string c = "config";
  FixSpec &f = p.fix;
  int64_t v = 0;
  std::string s;
  PF_ASSIGN(v, rd.integer(*cfg, c, "cp", 1));
  f.cp = int(v);
  {
    const json *sp = nullptr;
    PF_ASSIGN(sp, rd.field(*cfg, c, "sequence_parallel"));
    if (!sp->is_boolean())
      return rd.error("config.sequence_parallel", "expected true or false");
    f.sp = sp->get<bool>();
  }
  PF_ASSIGN(v, rd.integer(*cfg, c, "virtual_stages", 1));
  if (*f.schedule == PipelineSchedule::Interleaved1F1B)
    f.v = int(v);
  PF_ASSIGN(s, rd.string(*cfg, c, "recompute"));
  f.recompute = parseRecompute(s);
  if (!f.recompute)
    return rd.error("config.recompute", "unknown policy \"" + s + "\"");
  PF_ASSIGN(s, rd.string(*cfg, c, "layout"));
  f.layout = parseLayout(s);
  if (!f.layout)
    return rd.error("config.layout", "unknown process layout \"" + s + "\"");
  int64_t prod = int64_t(*f.dp) * *f.tp * *f.pp * *f.cp;
  if (prod != p.cluster.numDevices())
    return rd.error("config", "dp*tp*pp*cp = " + std::to_string(prod) +
                                  " but the cluster has " +
                                  std::to_string(p.cluster.numDevices()) +
                                  " devices");
  return Status::ok();
}

/// The op-level plan's "model", "config", "ops" and "params" (OpSearch.cpp
/// writes them; docs/op-sharding.md).
Status parseOpLevel(const Reader &rd, const json &j, LoadedPlan &p,
                    int64_t devices) {
  const json *model = nullptr;
  PF_ASSIGN(model, rd.field(j, "", "model"));
  const std::string mo = "model";
  PF_ASSIGN(p.modelName, rd.string(*model, mo, "name"));
  PF_ASSIGN(p.numOps, rd.integer(*model, mo, "ops", 1));
  PF_ASSIGN(p.numBackwardOps, rd.integer(*model, mo, "backward_ops", 0));
  PF_ASSIGN(p.numUpdateOps, rd.integer(*model, mo, "update_ops", 0));
  PF_ASSIGN(p.params, rd.number(*model, mo, "params"));
  PF_ASSIGN(p.precision, rd.string(*model, mo, "precision"));

  const json *cfg = nullptr;
  PF_ASSIGN(cfg, parseSharedConfig(rd, j, p.fix));
  const std::string c = "config";
  FixSpec &f = p.fix;
  int64_t v = 0;
  std::string s;
  if (*f.schedule != PipelineSchedule::GPipe &&
      *f.schedule != PipelineSchedule::OneFOneB)
    return rd.error("config.schedule",
                    std::string("op-level plans use \"gpipe\" or \"1f1b\", "
                                "got \"") +
                        scheduleKey(*f.schedule) + "\"");
  PF_ASSIGN(s, rd.string(*cfg, c, "recompute"));
  if (s != "none")
    return rd.error("config.recompute",
                    "op-level plans use \"none\", got \"" + s + "\"");
  f.recompute = RecomputePolicy::None;
  if (cfg->is_object() && cfg->contains("optimizer")) {
    PF_ASSIGN(s, rd.string(*cfg, c, "optimizer"));
    for (Optimizer o : {Optimizer::SGD, Optimizer::Momentum, Optimizer::Adam})
      if (s == optimizerName(o))
        p.optimizer = o;
    if (!p.optimizer)
      return rd.error("config.optimizer",
                      "expected \"sgd\", \"momentum\" or \"adam\", got \"" +
                          s + "\"");
  }
  // The choices must agree with each other and with the cluster.
  int64_t prod = int64_t(*f.dp) * *f.tp * *f.pp;
  if (prod != devices)
    return rd.error("config", "dp*tp*pp = " + std::to_string(prod) +
                                  " but the cluster has " +
                                  std::to_string(devices) + " devices");
  int64_t samples = int64_t(*f.dp) * *f.mbs * *f.numMicroBatches;
  if (samples != p.globalBatch)
    return rd.error("config", "dp*micro_batch_size*num_micro_batches = " +
                                  std::to_string(samples) +
                                  " but the global batch is " +
                                  std::to_string(p.globalBatch));
  if (*f.pp > p.numOps)
    return rd.error("config.pp", "pp=" + std::to_string(*f.pp) +
                                     " stages for " +
                                     std::to_string(p.numOps) + " ops");
  if (*f.zero > 0 && (!p.training || *f.dp == 1))
    return rd.error("config.zero_stage",
                    "zero " + std::to_string(*f.zero) +
                        " needs a training plan with dp > 1");

  // Every planned op with its strategy; every parameter with its layout.
  const json *ops = nullptr;
  PF_ASSIGN(ops, rd.field(j, "", "ops"));
  if (!ops->is_array())
    return rd.error("ops", "expected an array");
  if (int64_t(ops->size()) != p.numOps)
    return rd.error("ops", std::to_string(ops->size()) +
                               " entries, but model.ops is " +
                               std::to_string(p.numOps));
  for (size_t i = 0; i < ops->size(); ++i) {
    std::string at = "ops[" + std::to_string(i) + "]";
    PlannedOp op;
    PF_ASSIGN(v, rd.integer((*ops)[i], at, "id", 0));
    op.id = int(v);
    PF_ASSIGN(op.op, rd.string((*ops)[i], at, "op"));
    PF_ASSIGN(op.strategy, rd.string((*ops)[i], at, "strategy"));
    const json &jo = (*ops)[i];
    if (jo.contains("operands")) {
      const json &ls = jo["operands"];
      if (!ls.is_array())
        return rd.error(at + ".operands", "expected an array of layouts, got " +
                                              ls.dump());
      op.operands.emplace();
      for (size_t k = 0; k < ls.size(); ++k) {
        std::string lp = at + ".operands[" + std::to_string(k) + "]";
        if (!ls[k].is_string() || !Layout::parse(ls[k].get<std::string>()))
          return rd.error(lp, "expected a layout (R, P or S<dim>), got " +
                                  ls[k].dump());
        op.operands->push_back(ls[k].get<std::string>());
      }
    }
    if (jo.contains("result")) {
      std::string r;
      PF_ASSIGN(r, rd.string(jo, at, "result"));
      if (!Layout::parse(r))
        return rd.error(at + ".result",
                        "expected a layout (R, P or S<dim>), got \"" + r + "\"");
      op.result = r;
    }
    if (!p.ops.empty() && op.id <= p.ops.back().id)
      return rd.error(at + ".id", "ids must increase, got " +
                                      std::to_string(op.id) + " after " +
                                      std::to_string(p.ops.back().id));
    p.ops.push_back(std::move(op));
  }
  const json *params = nullptr;
  PF_ASSIGN(params, rd.field(j, "", "params"));
  if (!params->is_array())
    return rd.error("params", "expected an array");
  for (size_t i = 0; i < params->size(); ++i) {
    std::string at = "params[" + std::to_string(i) + "]";
    std::string name, layout;
    PF_ASSIGN(name, rd.string((*params)[i], at, "name"));
    PF_ASSIGN(layout, rd.string((*params)[i], at, "layout"));
    if (!Layout::parse(layout))
      return rd.error(at + ".layout", "expected a layout (R, P or S<dim>), "
                                      "got \"" + layout + "\"");
    p.paramLayouts.emplace_back(std::move(name), std::move(layout));
  }
  return Status::ok();
}

} // namespace

Expected<LoadedPlan> parsePlanFile(std::string_view text,
                                   std::string_view source) {
  Reader rd{std::string(source)};
  json j;
  {
    auto parsed = rt::parseJsonBounded<json>(text);
    if (!parsed)
      return Status::error(std::string(source) + ": " +
                           parsed.status().message());
    j = parsed.take();
  }
  if (!j.is_object())
    return rd.error("", "expected a JSON object (a dlopt plan file)");
  std::string format;
  PF_ASSIGN(format, rd.string(j, "", "format"));
  if (format != "dlopt-plan")
    return rd.error("format", "expected \"dlopt-plan\", got \"" + format +
                                  "\"");
  LoadedPlan p;
  // Transformer plan files of version 2 written before "kind" existed have
  // none.
  if (j.contains("kind")) {
    std::string kind;
    PF_ASSIGN(kind, rd.string(j, "", "kind"));
    if (kind == "op-level")
      p.kind = PlanKind::OpLevel;
    else if (kind != "transformer")
      return rd.error("kind", "expected \"transformer\" or \"op-level\", got "
                              "\"" + kind + "\"");
  }
  int64_t version = 0;
  PF_ASSIGN(version, rd.integer(j, "", "version", 0));
  const int want = planFileVersion(p.kind);
  if (version != want)
    return rd.error("version",
                    std::string("this dlopt reads ") + planKindName(p.kind) +
                        " plan files of version " + std::to_string(want) +
                        ", got version " + std::to_string(version) +
                        " (re-plan with this dlopt-compile's --dry-run "
                        "--format json)");
  p.version = int(version);
  std::string mode;
  PF_ASSIGN(mode, rd.string(j, "", "mode"));
  if (mode != "training" && mode != "forward")
    return rd.error("mode", "expected \"training\" or \"forward\", got \"" +
                                mode + "\"");
  p.training = mode == "training";
  PF_ASSIGN(p.globalBatch, rd.integer(j, "", "global_batch", 1));

  const json *cl = nullptr;
  PF_ASSIGN(cl, rd.field(j, "", "cluster"));
  int64_t devices = 0;
  PF_ASSIGN(devices, rd.integer(*cl, "cluster", "devices", 1));
  // Op-level plan files written before they could be read back have no
  // definition: they need --cluster.
  p.hasCluster = p.kind == PlanKind::Transformer || cl->contains("definition");
  if (p.hasCluster) {
    const json *def = nullptr;
    PF_ASSIGN(def, rd.field(*cl, "cluster", "definition"));
    auto cluster = parseCluster(def->dump(), ClusterFormat::Json,
                                std::string(source) + ": cluster.definition");
    if (!cluster)
      return cluster.status();
    p.cluster = *cluster;
    if (devices != p.cluster.numDevices())
      return rd.error("cluster.devices",
                      std::to_string(devices) + " devices, but the embedded "
                      "definition has " +
                          std::to_string(p.cluster.numDevices()));
  }

  Status st = p.kind == PlanKind::OpLevel ? parseOpLevel(rd, j, p, devices)
                                          : parseTransformer(rd, j, p);
  if (!st.isOk())
    return st;
  return p;
}

Expected<LoadedPlan> loadPlanFile(const std::string &path) {
  Expected<std::string> text = rt::readTextFileLimited(path, "plan file");
  if (!text)
    return text.status();
  return parsePlanFile(*text, path);
}

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

void compareParams(std::string &why, double plan, double model) {
  if (std::abs(plan - model) > 0.5)
    addWhy(why, "parameters " + std::to_string(int64_t(plan)) +
                    " in the plan, " + std::to_string(int64_t(model)) +
                    " in the model");
}

} // namespace

Status checkPlanMatchesModel(const LoadedPlan &p, const GraphSummary &g) {
  std::string why;
  if (p.kind == PlanKind::OpLevel) {
    OpGraphParts parts = splitOpGraph(g);
    compareCounts(why, "ops", p.numOps, int64_t(parts.forward.size()));
    compareCounts(why, "backward ops", p.numBackwardOps, parts.numBackward);
    compareCounts(why, "update ops", p.numUpdateOps, parts.numUpdate);
    compareParams(why, p.params, g.totalParams);
    if (why.empty()) {
      // Same counts: the same op at every planned position.
      for (size_t i = 0; i < p.ops.size() && i < parts.forward.size(); ++i) {
        const PlannedOp &po = p.ops[i];
        const OpNode &op = g.ops[parts.forward[i]];
        if (po.id != op.id || po.op != op.op) {
          addWhy(why, "planned op " + std::to_string(i) + " is #" +
                          std::to_string(po.id) + " " + po.op +
                          " in the plan, #" + std::to_string(op.id) + " " +
                          op.op + " in the model");
          break;
        }
      }
    }
  } else {
    compareCounts(why, "layers", p.layers, g.numLayers);
    compareCounts(why, "hidden", p.hidden, g.hidden);
    compareCounts(why, "heads", p.heads, g.heads);
    compareCounts(why, "seq", p.seq, g.seq);
    compareCounts(why, "vocab", p.vocab, g.vocab > 0 ? g.vocab : 1);
    compareParams(why, p.params, g.totalParams);
  }
  if (why.empty())
    return Status::ok();
  return Status::error("the plan was made for another model: " + why);
}

std::string compareOpSharding(const LoadedPlan &p, const OpPlanResult &now,
                              const GraphSummary &g) {
  std::vector<std::string> diffs;
  size_t n = 0;
  auto note = [&](const std::string &d) {
    if (diffs.size() < 3)
      diffs.push_back(d);
    ++n;
  };
  std::map<int, const OpChoice *> chosen;
  for (const OpChoice &c : now.choices)
    chosen[c.op] = &c;
  for (const PlannedOp &po : p.ops) {
    auto it = chosen.find(po.id);
    std::string got = it == chosen.end() ? "not planned" : it->second->strategy;
    const std::string &name = po.id >= 0 && po.id < int(g.ops.size())
                                  ? g.ops[po.id].op
                                  : po.op;
    std::string d = "#";
    d += std::to_string(po.id);
    d += " " + name + ": ";
    if (got != po.strategy) {
      note(d + po.strategy + " in the plan, " + got + " now");
      continue;
    }
    // Same strategy: its layouts must agree too.
    const OpChoice &c = *it->second;
    auto layouts = [](const std::vector<std::string> &ls) {
      std::string s;
      for (const std::string &l : ls)
        s += (s.empty() ? "" : ",") + l;
      return "(" + s + ")";
    };
    if (po.operands) {
      std::vector<std::string> now;
      for (const Layout &l : c.operands)
        now.push_back(l.str());
      if (now != *po.operands)
        note(d + "operands " + layouts(*po.operands) + " in the plan, " +
             layouts(now) + " now");
    }
    if (po.result && *po.result != c.result.str())
      note(d + "result " + *po.result + " in the plan, " + c.result.str() +
           " now");
  }
  std::map<std::string, std::string> layout;
  for (const auto &[name, l] : now.params)
    layout[name] = l.str();
  for (const auto &[name, l] : p.paramLayouts) {
    auto it = layout.find(name);
    std::string got = it == layout.end() ? "not planned" : it->second;
    if (got != l)
      note("param " + name + ": " + l + " in the plan, " + got + " now");
  }
  if (n == 0)
    return "";
  std::string out = "the re-solved sharding differs from the plan file in " +
                    std::to_string(n) + " place" + (n == 1 ? "" : "s") + " (";
  for (size_t i = 0; i < diffs.size(); ++i)
    out += (i ? "; " : "") + diffs[i];
  out += n > diffs.size() ? "; ...)" : ")";
  return out + "; the report shows the re-solved sharding (the file was "
               "edited, or the calibration or the solver differs from the "
               "one that wrote it)";
}

} // namespace dlopt::planner
