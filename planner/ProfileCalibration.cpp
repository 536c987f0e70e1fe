//===- ProfileCalibration.cpp - Calibration from a dlopt-run profile ------===//
#include "planner/ProfileCalibration.h"

#include "runtime/support/FileRead.h"
#include "runtime/support/JsonLimits.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>

namespace dlopt::planner {

namespace {

std::string fmt(const char *f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

/// The dtype suffix of a type string ("2x16x64xbf16" -> "bf16", "f32" ->
/// "f32").
std::string dtypeOf(const std::string &type) {
  size_t x = type.rfind('x');
  return x == std::string::npos ? type : type.substr(x + 1);
}

std::optional<Precision> precisionOfDtype(const std::string &d) {
  if (d == "bf16")
    return Precision::BF16;
  if (d == "f16")
    return Precision::FP16;
  if (d == "f32")
    return Precision::FP32;
  return std::nullopt;
}

/// A gradient kernel of a memory-bound op ("layer_norm_grad").
bool isGradient(const std::string &op) {
  return op.size() > 5 && op.compare(op.size() - 5, 5, "_grad") == 0;
}

/// Whether the planner prices `op` one by one at its memory class's rate,
/// so that its measured rate is that class's: not the runtime's fusions
/// (fused_elementwise: several of the planner's ops, and the optimizer's
/// multi-tensor update, which optimizer_gb_s prices), views (reshape), or
/// generated constants (iota).
bool pricedOneByOne(const std::string &op) {
  return op.rfind("fused", 0) != 0 && op != "reshape" && op != "iota" &&
         op != "constant" && op.find("adam") == std::string::npos &&
         op.find("sgd") == std::string::npos &&
         op.find("optimizer") == std::string::npos;
}

bool isConvolution(const std::string &op) {
  return op.rfind("conv2d", 0) == 0;
}

} // namespace

Expected<ProfileSamples> parseProfile(std::string_view text,
                                      std::string_view source) {
  const std::string where = std::string(source) + ": ";
  auto parsed = rt::parseJsonBounded<nlohmann::json>(text);
  if (!parsed)
    return Status::error(where + parsed.status().message());
  const nlohmann::json j = parsed.take();
  if (!j.is_object())
    return Status::error(where + "expected a dlopt-run --profile-json "
                                 "object, got " +
                         std::string(j.type_name()));
  auto field = [&](const nlohmann::json &o, const char *key,
                   const char *what) -> Expected<const nlohmann::json *> {
    auto it = o.find(key);
    if (it == o.end())
      return Status::error(where + "missing '" + key + "' (" + what + ")");
    return &*it;
  };
  auto number = [&](const nlohmann::json &o, const char *key,
                    const std::string &at) -> Expected<double> {
    auto it = o.find(key);
    if (it == o.end() || !it->is_number())
      return Status::error(where + at + key + ": expected a number" +
                           (it == o.end() ? ", missing"
                                          : ", got " +
                                                std::string(it->type_name())));
    // Bounded so that every derived constant stays finite once written
    // in the calibration file's units.
    double v = it->get<double>();
    if (!std::isfinite(v) || v < 0 || v > 1e18)
      return Status::error(where + at + key +
                           ": expected a number in [0, 1e18], got " +
                           fmt("%g", v));
    return v;
  };
  auto format = field(j, "format", "\"dlopt-profile\"");
  if (!format)
    return format.status();
  if (!(*format)->is_string() || **format != "dlopt-profile")
    return Status::error(where + "format: expected \"dlopt-profile\", got " +
                         (*format)->dump());
  auto version = number(j, "version", "");
  if (!version)
    return version.status();
  if (*version != 1)
    return Status::error(where + "version: expected 1, got " +
                         fmt("%g", *version));
  ProfileSamples p;
  auto backend = field(j, "backend", "the backend's name");
  if (!backend)
    return backend.status();
  if (!(*backend)->is_string())
    return Status::error(where + "backend: expected a string");
  p.backend = (*backend)->get<std::string>();
  auto timed = field(j, "device_timed", "true or false");
  if (!timed)
    return timed.status();
  if (!(*timed)->is_boolean())
    return Status::error(where + "device_timed: expected true or false");
  p.deviceTimed = (*timed)->get<bool>();
  for (auto [key, dst] : {std::pair{"runs", &p.runs},
                          std::pair{"instructions_per_run",
                                    &p.instructionsPerRun}}) {
    auto v = number(j, key, "");
    if (!v)
      return v.status();
    if (*v > 1e12 || *v != std::floor(*v))
      return Status::error(where + key + ": expected an integer, got " +
                           fmt("%g", *v));
    *dst = int64_t(*v);
  }
  auto issue = number(j, "issue_seconds", "");
  if (!issue)
    return issue.status();
  p.issueSeconds = *issue;
  auto instrs = field(j, "instructions", "an array of instructions");
  if (!instrs)
    return instrs.status();
  if (!(*instrs)->is_array())
    return Status::error(where + "instructions: expected an array");
  size_t i = 0;
  for (const nlohmann::json &in : **instrs) {
    const std::string at = "instructions[" + std::to_string(i++) + "].";
    if (!in.is_object())
      return Status::error(where + at + ": expected an object");
    ProfiledInstr r;
    auto op = in.find("op");
    if (op == in.end() || !op->is_string())
      return Status::error(where + at + "op: expected a string");
    r.op = op->get<std::string>();
    auto comm = in.find("communication");
    if (comm != in.end()) {
      if (!comm->is_boolean())
        return Status::error(where + at + "communication: expected true or "
                                          "false");
      r.communication = comm->get<bool>();
    }
    auto calls = number(in, "calls", at);
    auto seconds = number(in, "seconds", at);
    auto flops = number(in, "flops", at);
    auto bytes = number(in, "bytes", at);
    for (auto *e : {&calls, &seconds, &flops, &bytes})
      if (!*e)
        return e->status();
    if (*calls > 1e15 || *calls != std::floor(*calls))
      return Status::error(where + at + "calls: expected an integer, got " +
                           fmt("%g", *calls));
    r.calls = int64_t(*calls);
    r.seconds = *seconds;
    r.flops = *flops;
    r.bytes = *bytes;
    auto results = in.find("results");
    if (results != in.end()) {
      if (!results->is_array())
        return Status::error(where + at + "results: expected an array");
      if (!results->empty()) {
        if (!results->front().is_string())
          return Status::error(where + at +
                               "results: expected type strings");
        r.dtype = dtypeOf(results->front().get<std::string>());
      }
    }
    auto gemm = in.find("gemm");
    if (gemm != in.end()) {
      if (!gemm->is_object())
        return Status::error(where + at + "gemm: expected an object");
      const std::string gat = at + "gemm.";
      auto m = number(*gemm, "m", gat), n = number(*gemm, "n", gat),
           k = number(*gemm, "k", gat), b = number(*gemm, "batch", gat);
      for (auto *e : {&m, &n, &k, &b})
        if (!*e)
          return e->status();
      r.hasGemm = true;
      r.gemm = GemmShape{*m, *n, *k, std::max(1.0, *b)};
    }
    p.instrs.push_back(std::move(r));
  }
  return p;
}

Expected<ProfileSamples> loadProfile(const std::string &path) {
  Expected<std::string> text = rt::readTextFileLimited(path, "profile");
  if (!text)
    return text.status();
  return parseProfile(*text, path);
}

Expected<ProfileCalibration>
calibrateFromProfile(const std::vector<ProfileSamples> &profiles,
                     const GpuSpec &gpu) {
  ProfileCalibration out;
  Calibration &cal = out.calibration;
  const CostModel model(cal); // the defaults the measurements scale
  // GEMMs: the model's time against the measured time, by dtype.
  struct Sum {
    double measured = 0, predicted = 0, flops = 0;
    int64_t calls = 0;
  };
  std::map<std::string, Sum> gemms;
  Sum gemmAll, attention;
  double memoryBytes = 0, memorySeconds = 0;
  int64_t memoryCalls = 0;
  // Per memory class (memoryClassOf): the forward ops' bytes and seconds,
  // and the seconds of the forwards and of the gradients of the ops whose
  // gradient kernel ran too, for op_gb_s and op_backward_ratio.
  struct ClassSum {
    double bytes = 0, seconds = 0;
    int64_t calls = 0;
  };
  std::array<ClassSum, kNumMemoryClasses> classFwd{};
  std::map<std::string, double> opSeconds; // per op name, all calls
  double issue = 0, issued = 0;
  bool anyTimed = false, anyHostTimed = false;
  for (const ProfileSamples &p : profiles) {
    // A profile describes the device it ran on: a GPU's (cuda) or a CPU
    // device's (cpu), not another kind.
    const bool gpuBackend = p.backend != "cpu";
    if (gpuBackend != (gpu.sms > 0))
      return Status::error(
          "a profile taken on the " + p.backend + " backend cannot calibrate " +
          gpu.name + (gpu.sms > 0 ? " (a GPU)" : " (a device without SMs)") +
          ": give the device the profile ran on");
    anyHostTimed |= !p.deviceTimed;
    if (p.deviceTimed && p.runs > 0 && p.instructionsPerRun > 0) {
      issue += p.issueSeconds;
      issued += double(p.runs) * double(p.instructionsPerRun);
    }
    for (const ProfiledInstr &in : p.instrs) {
      if (in.calls <= 0 || !(in.seconds > 0))
        continue;
      anyTimed = true;
      const double calls = double(in.calls);
      if (in.op == "matmul" && in.hasGemm) {
        auto precision = precisionOfDtype(in.dtype);
        if (!precision)
          continue;
        auto t = model.gemmTime(in.gemm, in.bytes, *precision, gpu);
        if (!t || !(t->time > 0))
          continue;
        for (Sum *s : {&gemms[in.dtype], &gemmAll}) {
          s->measured += in.seconds;
          s->predicted += t->time * calls;
          s->flops += in.gemm.flops() * calls;
          s->calls += in.calls;
        }
      } else if (in.op == "attention") {
        auto precision = precisionOfDtype(in.dtype);
        if (!precision || !(gpu.peak(*precision) > 0) || !(in.flops > 0))
          continue;
        attention.measured += in.seconds;
        // FLOPs at the dtype's peak: the efficiency's denominator.
        attention.predicted += in.flops * calls / gpu.peak(*precision);
        attention.flops += in.flops * calls;
        attention.calls += in.calls;
      } else if (in.op != "attention_grad" && !isConvolution(in.op) &&
                 !in.communication && in.bytes > 0) {
        memorySeconds += in.seconds;
        memoryBytes += in.bytes * calls;
        memoryCalls += in.calls;
        if (pricedOneByOne(in.op)) {
          opSeconds[in.op] += in.seconds;
          if (!isGradient(in.op)) {
            ClassSum &c = classFwd[size_t(memoryClassOf(in.op))];
            c.bytes += in.bytes * calls;
            c.seconds += in.seconds;
            c.calls += in.calls;
          }
        }
      }
    }
  }
  if (!anyTimed)
    return Status::error("no profiled instruction with calls and seconds "
                         "(was the profile taken with --steps >= 2 or "
                         "--repeat >= 2?)");
  out.lines.push_back("device: " + gpu.name +
                      (anyHostTimed ? " (a profile is host-timed: its "
                                      "instructions include the host's "
                                      "issue and synchronize)"
                                    : ""));
  if (gemmAll.measured > 0) {
    const double scale = gemmAll.predicted / gemmAll.measured;
    const double before =
        gpu.sms > 0 ? cal.gemmPeakEfficiency : cal.matmulLargeEfficiency;
    if (before * scale > 1)
      out.lines.push_back(
          "note: the GEMMs ran " + fmt("%.3g", scale) +
          "x faster than the model at efficiency " + fmt("%.2f", before) +
          ", more than the device's peak allows: its peak understates this "
          "device (give a cluster file with the measured peak, as "
          "dlopt-calibrate writes on a CPU); the efficiency is clamped to 1");
    auto scaled = [&](double &efficiency) {
      efficiency = std::clamp(efficiency * scale, 1e-6, 1.0);
      return fmt("%.3f", efficiency);
    };
    std::string line = "GEMMs: " + std::to_string(gemmAll.calls) +
                       " calls, " + fmt("%.3f", gemmAll.measured * 1e3) +
                       " ms measured against " +
                       fmt("%.3f", gemmAll.predicted * 1e3) + " ms by the ";
    if (gpu.sms > 0) {
      line += "shape model: gemm_peak_efficiency " +
              scaled(cal.gemmPeakEfficiency);
    } else {
      line += "size classes: matmul_large_efficiency " +
              scaled(cal.matmulLargeEfficiency);
      line += ", matmul_small_efficiency " + scaled(cal.matmulSmallEfficiency);
    }
    out.lines.push_back(line);
    for (const auto &[dtype, s] : gemms)
      out.lines.push_back("  " + dtype + ": " +
                        fmt("%.3g", s.flops / s.measured / 1e12) +
                        " TFLOP/s measured, " +
                        fmt("%.3g", s.flops / s.predicted / 1e12) +
                        " by the model (" + std::to_string(s.calls) +
                        " calls; measured / model speed " +
                        fmt("%.3g", s.predicted / s.measured) + ")");
  } else {
    out.lines.push_back("GEMMs: none timed (gemm_peak_efficiency kept)");
  }
  cal.attentionEfficiency =
      gpu.attentionEfficiency > 0 ? gpu.attentionEfficiency
                                  : cal.attentionEfficiency;
  if (attention.measured > 0) {
    cal.attentionEfficiency =
        std::clamp(attention.predicted / attention.measured, 1e-6, 1.0);
    out.lines.push_back("attention (forward): " +
                        std::to_string(attention.calls) + " calls, " +
                        fmt("%.3g", attention.flops / attention.measured /
                                        1e12) +
                        " TFLOP/s: attention_efficiency " +
                        fmt("%.3f", cal.attentionEfficiency));
  } else {
    out.lines.push_back("attention: none timed (attention_efficiency kept "
                        "at the device's " +
                        fmt("%.2f", cal.attentionEfficiency) + ")");
  }
  cal.attentionEfficiencyGiven = true;
  if (memorySeconds > 0 && gpu.memoryBandwidth > 0) {
    const double rate = memoryBytes / memorySeconds;
    cal.memoryBandwidthEfficiency =
        std::clamp(rate / gpu.memoryBandwidth, 1e-6, 1.0);
    out.lines.push_back("memory-bound kernels: " +
                        std::to_string(memoryCalls) + " calls, " +
                        fmt("%.3g", rate / 1e9) +
                        " GB/s (bytes read + written): "
                        "memory_bandwidth_efficiency " +
                        fmt("%.3f", cal.memoryBandwidthEfficiency));
  }
  // The memory-bound ops the planner prices one by one, by class: their
  // rate (op_gb_s) and, where an op's gradient kernel ran too, the
  // gradients' time over their forwards' (op_backward_ratio).
  std::array<double, kNumMemoryClasses> gradSeconds{}, pairedFwdSeconds{};
  for (const auto &[op, seconds] : opSeconds) {
    if (!isGradient(op))
      continue;
    const std::string fwd = op.substr(0, op.size() - 5);
    auto it = opSeconds.find(fwd);
    if (it == opSeconds.end() || !(it->second > 0))
      continue;
    const size_t c = size_t(memoryClassOf(fwd));
    gradSeconds[c] += seconds;
    pairedFwdSeconds[c] += it->second;
  }
  std::string classes;
  for (size_t c = 0; c < kNumMemoryClasses; ++c) {
    const double rate = classFwd[c].bytes / classFwd[c].seconds;
    if (!(classFwd[c].seconds > 0) || !(rate > 0) || !std::isfinite(rate))
      continue;
    cal.opBandwidth[c] = rate;
    classes += std::string(classes.empty() ? "" : ", ") +
               memoryClassName(MemoryClass(c)) + " " +
               fmt("%.3g", cal.opBandwidth[c] / 1e9) + " GB/s (" +
               std::to_string(classFwd[c].calls) + " calls";
    if (pairedFwdSeconds[c] > 0 && gradSeconds[c] > 0) {
      cal.opBackwardRatio[c] =
          std::clamp(gradSeconds[c] / pairedFwdSeconds[c], 0.01, 100.0);
      classes += ", backward " + fmt("%.2f", cal.opBackwardRatio[c]) + "x";
    }
    classes += ")";
  }
  if (!classes.empty())
    out.lines.push_back("memory-bound ops by class: op_gb_s " + classes);
  if (issued > 0) {
    cal.kernelLaunchSeconds = issue / issued;
    out.lines.push_back("host issue: " +
                        fmt("%.2f", cal.kernelLaunchSeconds * 1e6) +
                        " us per instruction: kernel_launch_us");
  }
  return out;
}

} // namespace dlopt::planner
