//===- PlanFile.cpp - Reading a dlopt plan file back ----------------------===//
#include "planner/PlanFile.h"

#include <nlohmann/json.hpp>

#include <cmath>
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
  Expected<int64_t> integer(const json &obj, const std::string &path,
                            const char *key, int64_t min) const {
    auto f = field(obj, path, key);
    if (!f)
      return f.status();
    const json &v = **f;
    std::string p = path.empty() ? key : path + "." + key;
    if (!v.is_number_integer())
      return error(p, "expected an integer, got " + v.dump());
    int64_t i = v.get<int64_t>();
    if (i < min)
      return error(p, "expected an integer >= " + std::to_string(min) +
                          ", got " + std::to_string(i));
    return i;
  }
  Expected<std::string> string(const json &obj, const std::string &path,
                               const char *key) const {
    auto f = field(obj, path, key);
    if (!f)
      return f.status();
    if (!(*f)->is_string())
      return error(path.empty() ? key : path + "." + key,
                   "expected a string, got " + (*f)->dump());
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

Expected<LoadedPlan> parsePlanFile(std::string_view text,
                                   std::string_view source) {
  Reader rd{std::string(source)};
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error &e) {
    return Status::error(std::string(source) + ": invalid JSON: " + e.what());
  }
  if (!j.is_object())
    return rd.error("", "expected a JSON object (a dlopt plan file)");
  std::string format;
  PF_ASSIGN(format, rd.string(j, "", "format"));
  if (format != "dlopt-plan")
    return rd.error("format", "expected \"dlopt-plan\", got \"" + format +
                                  "\"");
  LoadedPlan p;
  int64_t version = 0;
  PF_ASSIGN(version, rd.integer(j, "", "version", 0));
  if (version != 2)
    return rd.error("version",
                    "this dlopt reads plan files of version 2, got version " +
                        std::to_string(version) +
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

  const json *model = nullptr;
  PF_ASSIGN(model, rd.field(j, "", "model"));
  PF_ASSIGN(p.modelName, rd.string(*model, "model", "name"));
  PF_ASSIGN(p.layers, rd.integer(*model, "model", "layers", 1));
  PF_ASSIGN(p.hidden, rd.integer(*model, "model", "hidden", 1));
  PF_ASSIGN(p.heads, rd.integer(*model, "model", "heads", 1));
  PF_ASSIGN(p.seq, rd.integer(*model, "model", "seq", 1));
  PF_ASSIGN(p.vocab, rd.integer(*model, "model", "vocab", 1));
  PF_ASSIGN(p.precision, rd.string(*model, "model", "precision"));
  {
    const json *params = nullptr;
    PF_ASSIGN(params, rd.field(*model, "model", "params"));
    if (!params->is_number())
      return rd.error("model.params", "expected a number");
    p.params = params->get<double>();
  }

  const json *cl = nullptr;
  PF_ASSIGN(cl, rd.field(j, "", "cluster"));
  const json *def = nullptr;
  PF_ASSIGN(def, rd.field(*cl, "cluster", "definition"));
  auto cluster = parseCluster(def->dump(), ClusterFormat::Json,
                              std::string(source) + ": cluster.definition");
  if (!cluster)
    return cluster.status();
  p.cluster = *cluster;
  int64_t devices = 0;
  PF_ASSIGN(devices, rd.integer(*cl, "cluster", "devices", 1));
  if (devices != p.cluster.numDevices())
    return rd.error("cluster.devices",
                    std::to_string(devices) + " devices, but the embedded "
                    "definition has " +
                        std::to_string(p.cluster.numDevices()));

  const json *cfg = nullptr;
  PF_ASSIGN(cfg, rd.field(j, "", "config"));
  const std::string c = "config";
  FixSpec &f = p.fix;
  int64_t v = 0;
  PF_ASSIGN(v, rd.integer(*cfg, c, "dp", 1));
  f.dp = int(v);
  PF_ASSIGN(v, rd.integer(*cfg, c, "tp", 1));
  f.tp = int(v);
  PF_ASSIGN(v, rd.integer(*cfg, c, "pp", 1));
  f.pp = int(v);
  PF_ASSIGN(v, rd.integer(*cfg, c, "cp", 1));
  f.cp = int(v);
  {
    const json *sp = nullptr;
    PF_ASSIGN(sp, rd.field(*cfg, c, "sequence_parallel"));
    if (!sp->is_boolean())
      return rd.error("config.sequence_parallel", "expected true or false");
    f.sp = sp->get<bool>();
  }
  PF_ASSIGN(v, rd.integer(*cfg, c, "micro_batch_size", 1));
  f.mbs = v;
  PF_ASSIGN(v, rd.integer(*cfg, c, "num_micro_batches", 1));
  f.numMicroBatches = v;
  std::string s;
  PF_ASSIGN(s, rd.string(*cfg, c, "schedule"));
  f.schedule = parseSchedule(s);
  if (!f.schedule)
    return rd.error("config.schedule", "unknown schedule \"" + s + "\"");
  PF_ASSIGN(v, rd.integer(*cfg, c, "virtual_stages", 1));
  if (*f.schedule == PipelineSchedule::Interleaved1F1B)
    f.v = int(v);
  PF_ASSIGN(v, rd.integer(*cfg, c, "zero_stage", 0));
  if (v > 3)
    return rd.error("config.zero_stage",
                    "expected 0 to 3, got " + std::to_string(v));
  f.zero = int(v);
  PF_ASSIGN(s, rd.string(*cfg, c, "recompute"));
  f.recompute = parseRecompute(s);
  if (!f.recompute)
    return rd.error("config.recompute", "unknown policy \"" + s + "\"");
  PF_ASSIGN(s, rd.string(*cfg, c, "layout"));
  f.layout = parseLayout(s);
  if (!f.layout)
    return rd.error("config.layout", "unknown process layout \"" + s + "\"");
  int64_t prod = int64_t(*f.dp) * *f.tp * *f.pp * *f.cp;
  if (prod != devices)
    return rd.error("config", "dp*tp*pp*cp = " + std::to_string(prod) +
                                  " but the cluster has " +
                                  std::to_string(devices) + " devices");
  return p;
}

Expected<LoadedPlan> loadPlanFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Status::error(path + ": cannot open plan file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parsePlanFile(ss.str(), path);
}

Status checkPlanMatchesModel(const LoadedPlan &p, const GraphSummary &g) {
  std::string why;
  auto cmp = [&](const char *what, int64_t plan, int64_t model) {
    if (plan != model)
      why += std::string(why.empty() ? "" : "; ") + what + " " +
             std::to_string(plan) + " in the plan, " + std::to_string(model) +
             " in the model";
  };
  cmp("layers", p.layers, g.numLayers);
  cmp("hidden", p.hidden, g.hidden);
  cmp("heads", p.heads, g.heads);
  cmp("seq", p.seq, g.seq);
  cmp("vocab", p.vocab, g.vocab > 0 ? g.vocab : 1);
  if (std::abs(p.params - g.totalParams) > 0.5)
    why += std::string(why.empty() ? "" : "; ") + "parameters " +
           std::to_string(int64_t(p.params)) + " in the plan, " +
           std::to_string(int64_t(g.totalParams)) + " in the model";
  if (why.empty())
    return Status::ok();
  return Status::error("the plan was made for another model: " + why);
}

} // namespace dlopt::planner
