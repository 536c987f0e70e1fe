//===- Trainer.cpp - The training loop over a training-step plan ----------===//

#include "runtime/exec/Trainer.h"
#include "runtime/exec/Checkpoint.h"
#include "runtime/exec/SafeTensors.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

namespace dlopt::rt {

namespace {

double now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// A scalar float output of the plan, by name, or -1.
int findScalarOutput(const Executable &exe, const std::string &name) {
  for (size_t i = 0; i < exe.outputs.size(); ++i)
    if (exe.outputNames[i] == name) {
      const TensorType &t = argumentType(exe, exe.outputs[i]);
      return t.shape.empty() && isFloat(t.dtype) ? int(i) : -1;
    }
  return -1;
}

int32_t findInput(const Executable &exe, const std::string &name) {
  for (int32_t id : exe.inputs)
    if (exe.values[id].name == name)
      return id;
  return -1;
}

/// JSON number, or null for NaN/Inf (JSON has neither).
std::string jsonNumber(double v, const char *fmt = "%.9g") {
  if (!std::isfinite(v))
    return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

std::string fmt(const char *f, double v) {
  if (std::isnan(v))
    return "nan"; // never "-nan"
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

/// 12345 -> "12.3k".
std::string humanRate(double v) {
  const char *units[] = {"", "k", "M", "G"};
  int u = 0;
  while (v >= 1000 && u < 3) {
    v /= 1000;
    ++u;
  }
  return fmt(u ? "%.1f" : "%.0f", v) + units[u];
}

std::string clock(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0)
    return "?";
  long s = long(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, s / 60 % 60,
                  s % 60);
  else
    std::snprintf(buf, sizeof(buf), "%ld:%02ld", s / 60, s % 60);
  return buf;
}

} // namespace

Trainer::Trainer(StepRunner &session, const DataLoader &train,
                 const DataLoader *eval, const TrainerOptions &opts)
    : session_(session), train_(train), eval_(eval), opts_(opts),
      log_(opts.log ? opts.log : stderr), seed_(opts.seed) {}

Expected<std::unique_ptr<Trainer>>
Trainer::create(StepRunner &session, const DataLoader &train,
                const DataLoader *eval, const TrainerOptions &opts) {
  const Executable &exe = session.executable();
  if (!session.hasUpdates())
    return Status::error("the plan is not a training step: no output updates "
                         "a param or state (compile it with dlopt-compile "
                         "--train)");
  if (findScalarOutput(exe, "loss") < 0)
    return Status::error("the plan has no scalar float output named 'loss'");
  if (opts.steps < 0 || opts.logEvery < 1 || opts.evalEvery < 0 ||
      opts.evalBatches < 0 || opts.checkpointEvery < 0)
    return Status::error("invalid trainer options");

  std::vector<std::string> fed = train.inputs();
  std::set<std::string> fedSet(fed.begin(), fed.end());
  for (const std::string &name : session.missingInputs())
    if (!fedSet.count(name))
      return Status::error("input '" + name + "' is fed neither by the data (" +
                           train.describe() + ") nor bound");
  if (eval) {
    std::vector<std::string> ev = eval->inputs();
    if (std::set<std::string>(ev.begin(), ev.end()) != fedSet) {
      auto list = [](const std::vector<std::string> &v) {
        std::string s;
        for (const std::string &n : v)
          s += (s.empty() ? "" : ", ") + n;
        return s;
      };
      return Status::error("the eval data feeds " + list(ev) +
                           " but the training data feeds " + list(fed));
    }
  }

  std::unique_ptr<Trainer> t(new Trainer(session, train, eval, opts));
  if (int32_t tok = findInput(exe, "tokens"); tok >= 0)
    t->tokensPerStep_ = argumentType(exe, tok).numElements();
  for (const std::string &name : fed) {
    const TensorType &type = argumentType(exe, findInput(exe, name));
    if (!type.shape.empty()) {
      t->samplesPerStep_ = type.shape[0];
      break;
    }
  }
  for (int32_t id : exe.states)
    t->lossScaling_ |= exe.values[id].name == "loss_scale";
  t->hasLr_ = findScalarOutput(exe, "lr") >= 0;
  t->hasGradNorm_ = findScalarOutput(exe, "grad_norm") >= 0;
  // Accuracy: logits [..., C] and int labels [...] of the same leading shape.
  int32_t labels = findInput(exe, "labels");
  for (size_t i = 0; i < exe.outputs.size() && labels >= 0; ++i)
    if (exe.outputNames[i] == "logits") {
      const TensorType &lt = argumentType(exe, exe.outputs[i]);
      const TensorType &yt = argumentType(exe, labels);
      t->hasAccuracy_ =
          isFloat(lt.dtype) && isInteger(yt.dtype) &&
          lt.shape.size() == yt.shape.size() + 1 &&
          std::equal(yt.shape.begin(), yt.shape.end(), lt.shape.begin());
    }
  return t;
}

namespace {
/// Bytes of a file, or of the files directly in a directory.
int64_t pathBytes(const std::string &path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec))
    return int64_t(std::filesystem::file_size(path, ec));
  int64_t total = 0;
  for (const auto &e : std::filesystem::directory_iterator(path, ec))
    if (e.is_regular_file(ec))
      total += int64_t(e.file_size(ec));
  return total;
}
} // namespace

Status Trainer::resume(const std::string &path) {
  auto t0 = std::chrono::steady_clock::now();
  Expected<CheckpointState> st = loadCheckpoint(session_, path);
  if (!st)
    return st.status();
  resumeSeconds_ = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - t0)
                       .count();
  resumeBytes_ = pathBytes(path);
  step_ = st->step;
  position_ = st->dataPosition;
  seed_ = st->rngSeed;
  if (!st->dataSource.empty() && st->dataSource != train_.describe())
    note("note: the checkpoint was trained on " + st->dataSource +
         ", continuing on " + train_.describe());
  return Status::ok();
}

void Trainer::prefetch(uint64_t index) {
  if (prefetch_.valid())
    prefetch_.wait();
  prefetchIndex_ = index;
  prefetchSeed_ = seed_;
  const uint64_t seed = seed_;
  const DataLoader &loader = train_;
  prefetch_ = std::async(std::launch::async, [&loader, index, seed] {
    return loader.batch(index, seed);
  });
}

std::optional<Expected<std::vector<NamedTensor>>>
Trainer::takePrefetched(uint64_t index) {
  if (!prefetch_.valid())
    return std::nullopt;
  // get() rethrows what batch() threw; bindBatch reports it.
  Expected<std::vector<NamedTensor>> b = prefetch_.get();
  if (prefetchIndex_ != index || prefetchSeed_ != seed_)
    return std::nullopt; // resumed or re-seeded since: draw it anew
  return b;
}

Status Trainer::bindBatch(const DataLoader &loader, uint64_t index) {
  Expected<std::vector<NamedTensor>> batch = Status::error("no batch");
  try {
    std::optional<Expected<std::vector<NamedTensor>>> ready;
    if (&loader == &train_)
      ready = takePrefetched(index);
    if (ready)
      batch = std::move(*ready);
    else
      batch = loader.batch(index, seed_);
  } catch (const std::exception &e) {
    return Status::error(loader.describe() + ": batch " +
                         std::to_string(index) + ": " + e.what());
  }
  if (!batch)
    return batch.status();
  for (const NamedTensor &t : *batch)
    DLOPT_RETURN_IF_ERROR(session_.bind(t.name, t.tensor, loader.describe()));
  return Status::ok();
}

std::optional<double> Trainer::lossScale() const {
  if (!lossScaling_)
    return std::nullopt;
  Expected<HostTensor> v = session_.readArgument("loss_scale");
  if (!v || v->numElements() != 1)
    return std::nullopt;
  return v->elementAsDouble(0);
}

Expected<StepResult> Trainer::step() {
  double start = now();
  StepResult r;
  r.step = step_ + 1;
  DLOPT_RETURN_IF_ERROR(bindBatch(train_, position_));
  // The next batch is drawn while this step runs (positions only move
  // forward by one per step; anything else draws anew).
  prefetch(position_ + 1);
  // Under loss scaling the plan itself skips a step whose gradients (or
  // loss) are not finite, and halves the scale: that is how a skip shows.
  // (Read before running: the update may happen in place.)
  std::optional<double> scaleBefore = lossScale();
  DLOPT_RETURN_IF_ERROR(session_.execute());
  r.runSeconds = session_.lastRunSeconds();
  r.issueSeconds = session_.lastIssueSeconds();
  Expected<HostTensor> loss = session_.readOutput("loss");
  if (!loss)
    return loss.status();
  r.loss = loss->elementAsDouble(0);
  if (hasLr_)
    if (Expected<HostTensor> v = session_.readOutput("lr"))
      r.lr = v->elementAsDouble(0);
  if (hasGradNorm_)
    if (Expected<HostTensor> v = session_.readOutput("grad_norm"))
      r.gradNorm = v->elementAsDouble(0);
  if (!std::isfinite(r.loss) && !lossScaling_) {
    r.diverged = true;
    r.seconds = now() - start;
    return r;
  }
  DLOPT_RETURN_IF_ERROR(session_.applyUpdates());
  if (lossScaling_) {
    r.lossScale = lossScale();
    r.skipped = !std::isfinite(r.loss) ||
                (scaleBefore && r.lossScale && *r.lossScale < *scaleBefore);
  }
  ++step_;
  ++position_;
  r.seconds = now() - start;
  r.throughput = r.seconds > 0 ? double(itemsPerStep()) / r.seconds : 0;
  return r;
}

Expected<EvalResult> Trainer::evaluate() {
  if (!eval_)
    return Status::error("no eval data");
  int64_t batches = opts_.evalBatches;
  if (batches == 0)
    batches = int64_t(std::max<uint64_t>(1, eval_->batchesPerEpoch()));
  EvalResult r;
  r.batches = batches;
  double lossSum = 0;
  int64_t correct = 0, counted = 0;
  for (int64_t b = 0; b < batches; ++b) {
    DLOPT_RETURN_IF_ERROR(bindBatch(*eval_, uint64_t(b)));
    // The step program runs whole (backward too); params and states are
    // left unchanged, even where updates are computed in place.
    DLOPT_RETURN_IF_ERROR(session_.execute(/*keepArguments=*/true));
    Expected<HostTensor> loss = session_.readOutput("loss");
    if (!loss)
      return loss.status();
    lossSum += loss->elementAsDouble(0);
    if (!hasAccuracy_)
      continue;
    Expected<HostTensor> logits = session_.readOutput("logits");
    Expected<HostTensor> labels = session_.readArgument("labels");
    if (!logits)
      return logits.status();
    if (!labels)
      return labels.status();
    int64_t c = logits->type.shape.back();
    int64_t rows = labels->numElements();
    for (int64_t i = 0; i < rows; ++i) {
      double y = labels->elementAsDouble(i);
      if (y < 0 || y >= double(c))
        continue; // ignored label (e.g. ignore_index)
      int64_t best = 0;
      double bestV = logits->elementAsDouble(i * c);
      for (int64_t k = 1; k < c; ++k) {
        double v = logits->elementAsDouble(i * c + k);
        if (v > bestV) {
          bestV = v;
          best = k;
        }
      }
      correct += best == int64_t(y);
      ++counted;
    }
  }
  r.loss = lossSum / double(batches);
  if (hasAccuracy_ && counted > 0)
    r.accuracy = double(correct) / double(counted);
  return r;
}

Status Trainer::checkpointTo(const std::string &path) {
  CheckpointState st;
  st.step = step_;
  st.dataPosition = position_;
  st.dataEpoch = train_.epochOf(position_);
  st.rngSeed = seed_;
  st.dataSource = train_.describe();
  auto t0 = std::chrono::steady_clock::now();
  DLOPT_RETURN_IF_ERROR(saveCheckpoint(session_, path, st));
  checkpointSeconds_ = std::chrono::duration<double>(
                           std::chrono::steady_clock::now() - t0)
                           .count();
  checkpointBytes_ = pathBytes(path);
  lastCheckpoint_ = path;
  return Status::ok();
}

Expected<std::string> Trainer::checkpoint() {
  if (opts_.checkpointDir.empty())
    return Status::error("no checkpoint directory");
  std::error_code ec;
  std::filesystem::create_directories(opts_.checkpointDir, ec);
  if (ec)
    return Status::error("cannot create checkpoint directory '" +
                         opts_.checkpointDir + "': " + ec.message());
  std::string path =
      (std::filesystem::path(opts_.checkpointDir) / checkpointName(step_, session_.shardedCheckpoints()))
          .string();
  DLOPT_RETURN_IF_ERROR(checkpointTo(path));
  return path;
}

std::string Trainer::metricsLine(const StepResult &r) const {
  std::string s = "{\"step\": " + std::to_string(r.step) +
                  ", \"loss\": " + jsonNumber(r.loss);
  if (hasLr_)
    s += ", \"lr\": " + jsonNumber(r.lr.value_or(NAN));
  if (hasGradNorm_)
    s += ", \"grad_norm\": " + jsonNumber(r.gradNorm.value_or(NAN));
  s += std::string(", \"") +
       (tokenThroughput() ? "tokens_per_s" : "samples_per_s") +
       "\": " + jsonNumber(r.throughput, "%.6g");
  s += ", \"step_time_s\": " + jsonNumber(r.seconds, "%.6g");
  if (r.runSeconds >= 0 && r.issueSeconds >= 0) {
    s += ", \"run_time_s\": " + jsonNumber(r.runSeconds, "%.6g");
    s += ", \"issue_time_s\": " + jsonNumber(r.issueSeconds, "%.6g");
  }
  s += ", \"epoch\": " + std::to_string(train_.epochOf(position_ - (r.diverged ? 0 : 1)));
  if (r.skipped)
    s += ", \"skipped\": true";
  if (r.lossScale)
    s += ", \"loss_scale\": " + jsonNumber(*r.lossScale);
  if (r.diverged)
    s += ", \"diverged\": true";
  if (r.eval) {
    s += ", \"eval_loss\": " + jsonNumber(r.eval->loss);
    if (r.eval->accuracy)
      s += ", \"eval_accuracy\": " + jsonNumber(*r.eval->accuracy);
    s += ", \"eval_batches\": " + std::to_string(r.eval->batches);
  }
  return s + "}";
}

void Trainer::note(const std::string &line) {
  if (opts_.progress == TrainerOptions::Progress::None)
    return;
  if (barShown_) {
    std::fputs("\r\x1b[2K", log_);
    barShown_ = false;
    lastBarTime_ = -1; // redraw at the next step
  }
  std::fprintf(log_, "%s\n", line.c_str());
  std::fflush(log_);
}

void Trainer::showProgress(const StepResult &r, int64_t done, int64_t total,
                           double elapsed, bool last) {
  const char *unit = tokenThroughput() ? "tokens/s" : "samples/s";
  int64_t target = step_ - done + total;
  if (opts_.progress == TrainerOptions::Progress::Lines) {
    if (!(last || r.skipped || done % opts_.logEvery == 0))
      return;
    std::string line = "step " + std::to_string(r.step) + "/" +
                       std::to_string(target) + "  loss " +
                       fmt("%.6g", r.loss);
    if (r.lr)
      line += "  lr " + fmt("%.4g", *r.lr);
    if (r.gradNorm)
      line += "  grad_norm " + fmt("%.4g", *r.gradNorm);
    line += "  " + fmt("%.0f", r.throughput) + " " + unit + "  " +
            fmt("%.2f", r.seconds * 1e3) + " ms";
    if (r.skipped)
      line += "  (non-finite gradients: step skipped by loss scaling" +
              (r.lossScale ? ", scale now " + fmt("%g", *r.lossScale) : "") +
              ")";
    note(line);
    return;
  }
  if (opts_.progress != TrainerOptions::Progress::Bar)
    return;
  if (r.skipped)
    note("step " + std::to_string(r.step) +
         ": non-finite gradients, step skipped by loss scaling" +
         (r.lossScale ? " (scale now " + fmt("%g", *r.lossScale) + ")" : ""));
  // Redraw at most ten times a second; always the last step.
  double t = now();
  if (!last && lastBarTime_ >= 0 && t - lastBarTime_ < 0.1)
    return;
  lastBarTime_ = t;
  constexpr int kWidth = 24;
  int filled = total > 0 ? int(kWidth * done / total) : kWidth;
  std::string bar(size_t(filled), '#');
  bar.append(size_t(kWidth - filled), '.');
  double rate = elapsed > 0 ? double(done * itemsPerStep()) / elapsed : 0;
  double eta = done > 0 ? elapsed / double(done) * double(total - done) : NAN;
  std::string line = "step " + std::to_string(r.step) + "/" +
                     std::to_string(target) + " [" + bar + "] loss " +
                     fmt("%.4f", r.loss);
  if (r.lr)
    line += " lr " + fmt("%.2e", *r.lr);
  line += " " + humanRate(rate) + " " + unit + " ";
  line += last ? "in " + clock(elapsed) : "ETA " + clock(eta);
  std::fprintf(log_, "\r\x1b[2K%s", line.c_str());
  barShown_ = true;
  if (last) {
    std::fputs("\n", log_);
    barShown_ = false;
  }
  std::fflush(log_);
}

Status Trainer::run() {
  Status st = runLoop();
  if (!st && barShown_) {
    std::fputs("\n", log_); // keep the error off the progress line
    barShown_ = false;
  }
  return st;
}

Status Trainer::runLoop() {
  if (opts_.steps < 0 || opts_.steps > kMaxTrainingStep - step_)
    return Status::error(std::to_string(opts_.steps) + " steps after step " +
                         std::to_string(step_) + " would pass the largest "
                         "step count " + std::to_string(kMaxTrainingStep));
  // Fail before the first step, not after hours of training.
  if (!opts_.checkpointDir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(opts_.checkpointDir, ec);
    if (ec)
      return Status::error("cannot create checkpoint directory '" +
                           opts_.checkpointDir + "': " + ec.message());
    // A writer killed mid-checkpoint leaves a temporary file as large as a
    // checkpoint; nothing else would ever remove it.
    for (const std::string &name : removeStaleTempFiles(opts_.checkpointDir))
      std::fprintf(log_, "note: removed %s/%s, left by a killed checkpoint "
                   "writer\n", opts_.checkpointDir.c_str(), name.c_str());
  }
  std::FILE *metrics = nullptr;
  if (!opts_.metricsPath.empty()) {
    metrics = std::fopen(opts_.metricsPath.c_str(), "a");
    if (!metrics)
      return Status::error("cannot open metrics file '" + opts_.metricsPath +
                           "': " + std::strerror(errno));
  }
  struct Closer {
    std::FILE *f;
    ~Closer() {
      if (f)
        std::fclose(f);
    }
  } closer{metrics};

  double start = now();
  int64_t total = opts_.steps;
  for (int64_t done = 1; done <= total; ++done) {
    Expected<StepResult> r = step();
    if (!r)
      return r.status().withContext("step " + std::to_string(step_ + 1) +
                                    ": ");
    if (r->diverged) {
      if (metrics) {
        std::fprintf(metrics, "%s\n", metricsLine(*r).c_str());
        std::fflush(metrics);
      }
      history_.push_back(*r);
      std::string what = std::isnan(r->loss) ? "nan"
                         : r->loss > 0          ? "inf"
                                                : "-inf";
      std::string msg = "loss is " + what + " at step " +
                        std::to_string(r->step) +
                        "; stopping (nothing from this step is saved";
      msg += lastCheckpoint_.empty()
                 ? ")"
                 : "; the last checkpoint is " + lastCheckpoint_ + ")";
      if (barShown_) {
        std::fputs("\n", log_);
        barShown_ = false;
      }
      return Status::error(msg);
    }
    bool last = done == total;
    bool evalNow = eval_ && ((opts_.evalEvery > 0 &&
                              r->step % opts_.evalEvery == 0) ||
                             (last && (opts_.evalEvery == 0 ||
                                       r->step % opts_.evalEvery != 0)));
    history_.push_back(*r);
    showProgress(*r, done, total, now() - start, last);
    if (evalNow) {
      Expected<EvalResult> e = evaluate();
      if (!e)
        return e.status().withContext("evaluating at step " +
                                      std::to_string(r->step) + ": ");
      r->eval = *e;
      history_.back().eval = *e;
      std::string line = "eval at step " + std::to_string(r->step) +
                         ": loss " + fmt("%.6g", e->loss);
      if (e->accuracy)
        line += "  accuracy " + fmt("%.4f", *e->accuracy);
      line += "  (" + std::to_string(e->batches) + " batches)";
      note(line);
    }
    if (metrics) {
      std::fprintf(metrics, "%s\n", metricsLine(*r).c_str());
      std::fflush(metrics);
    }
    if (!opts_.checkpointDir.empty() && opts_.checkpointEvery > 0 &&
        r->step % opts_.checkpointEvery == 0) {
      Expected<std::string> path = checkpoint();
      if (!path)
        return path.status();
    }
  }
  // At exit, unless the last step was just saved.
  if (!opts_.checkpointDir.empty() &&
      lastCheckpoint_ !=
          (std::filesystem::path(opts_.checkpointDir) / checkpointName(step_, session_.shardedCheckpoints()))
              .string()) {
    Expected<std::string> path = checkpoint();
    if (!path)
      return path.status();
  }
  return Status::ok();
}

} // namespace dlopt::rt
