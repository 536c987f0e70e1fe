//===- NcclTests.cpp - Collective measurements from nccl-tests' output ----===//
#include "planner/NcclTests.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

namespace dlopt::planner {
namespace {

std::vector<std::string_view> tokens(std::string_view s) {
  std::vector<std::string_view> t;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i])))
      ++i;
    size_t j = i;
    while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j])))
      ++j;
    if (j > i)
      t.push_back(s.substr(i, j - i));
    i = j;
  }
  return t;
}

bool allDigits(std::string_view s) {
  return !s.empty() && s.size() <= 18 &&
         std::all_of(s.begin(), s.end(), [](char c) {
           return std::isdigit(static_cast<unsigned char>(c));
         });
}

/// A finite number that is the whole token.
std::optional<double> number(std::string_view s) {
  if (s.empty() || s.size() > 40)
    return std::nullopt;
  std::string str(s);
  char *end = nullptr;
  double v = std::strtod(str.c_str(), &end);
  if (end != str.c_str() + str.size() || !std::isfinite(v))
    return std::nullopt;
  return v;
}

std::string shown(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 60))
    out += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  return out;
}

/// Three significant digits.
std::string g3(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", v);
  return b;
}

/// busbw / algbw of the collective over n ranks (nccl-tests' factors).
double busFactor(Collective c, int n) {
  switch (c) {
  case Collective::AllReduce:
    return 2.0 * (n - 1) / n;
  case Collective::AllGather:
  case Collective::ReduceScatter:
  case Collective::AllToAll:
    return double(n - 1) / n;
  case Collective::Broadcast:
  case Collective::SendRecv:
    return 1.0;
  }
  return 1.0;
}

constexpr size_t kMaxRanks = size_t(1) << 20;

struct Section {
  int line = 0;
  std::optional<Collective> collective;
  std::string program; ///< from "Collective test starting"
  std::map<int64_t, std::string> hostOfRank;
  std::string device;
  std::vector<std::pair<double, double>> rows; ///< bytes, seconds
  std::set<double> sizes;
  bool checkedFactor = false;
};

} // namespace

std::optional<Collective> collectiveOfNcclTestsName(std::string_view name) {
  const size_t slash = name.find_last_of('/');
  if (slash != std::string_view::npos)
    name = name.substr(slash + 1);
  std::string flat;
  for (char c : name)
    if (c != '_' && c != '-')
      flat += char(std::tolower(static_cast<unsigned char>(c)));
  const std::pair<const char *, Collective> known[] = {
      {"allreduce", Collective::AllReduce},
      {"allgather", Collective::AllGather},
      {"reducescatter", Collective::ReduceScatter},
      {"alltoall", Collective::AllToAll},
      {"broadcast", Collective::Broadcast}};
  std::optional<Collective> found;
  for (const auto &[k, c] : known)
    if (flat.find(k) != std::string::npos) {
      if (found)
        return std::nullopt; // two names: ambiguous
      found = c;
    }
  return found;
}

Expected<std::vector<NcclTestsSweep>>
parseNcclTests(std::string_view text, std::string_view source,
               std::optional<Collective> fallback) {
  const std::string src(source);
  std::vector<NcclTestsSweep> out;
  std::optional<Section> cur;
  std::optional<Collective> pending; // from "Collective test starting"
  std::string pendingProgram;
  int lineNo = 0;
  auto at = [&](int line) { return src + ":" + std::to_string(line) + ": "; };

  auto finish = [&]() -> Status {
    if (!cur)
      return Status::ok();
    Section s = std::move(*cur);
    cur.reset();
    if (s.rows.empty())
      return Status::error(at(s.line) + "the test starting here has no "
                                        "result rows (did it fail?)");
    NcclTestsSweep sw;
    sw.collective = *s.collective;
    sw.ranks = int(s.hostOfRank.size());
    std::map<std::string, int> perHost;
    for (const auto &[rank, host] : s.hostOfRank)
      ++perHost[host];
    sw.nodes = int(perHost.size());
    for (const auto &[host, n] : perHost)
      sw.ranksPerNode = std::max(sw.ranksPerNode, n);
    sw.device = s.device;
    sw.line = s.line;
    std::sort(s.rows.begin(), s.rows.end());
    for (const auto &[bytes, seconds] : s.rows) {
      CollectiveTableRow r;
      r.collective = sw.collective;
      r.ranks = sw.ranks;
      r.nodes = sw.nodes;
      r.ranksPerNode = sw.ranksPerNode;
      r.bytes = bytes;
      r.seconds = seconds;
      sw.rows.push_back(r);
    }
    out.push_back(std::move(sw));
    return Status::ok();
  };
  auto begin = [&](int line) -> Status {
    DLOPT_RETURN_IF_ERROR(finish());
    cur.emplace();
    cur->line = line;
    cur->collective = pending ? pending : fallback;
    cur->program = pendingProgram;
    pending.reset();
    pendingProgram.clear();
    return Status::ok();
  };

  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos)
      eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++lineNo;
    std::vector<std::string_view> t = tokens(line);
    if (t.empty())
      continue;
    if (t[0][0] == '#') {
      // Comment lines: "#" alone or glued to the first word.
      if (t[0].size() > 1)
        t[0] = t[0].substr(1);
      else
        t.erase(t.begin());
      if (t.empty())
        continue;
      if (t.size() >= 4 && t[0] == "Collective" && t[1] == "test" &&
          t[2] == "starting:") {
        std::string_view prog = t[3];
        std::string_view name = prog;
        if (name.size() > 5 && name.substr(name.size() - 5) == "_perf")
          name = name.substr(0, name.size() - 5);
        Collective c;
        if (!collectiveFromTableName(name, c))
          return Status::error(
              at(lineNo) + "'" + shown(prog) +
              "' measures no collective dlopt prices (all_reduce_perf, "
              "all_gather_perf, reduce_scatter_perf, alltoall_perf, "
              "broadcast_perf)");
        DLOPT_RETURN_IF_ERROR(finish());
        pending = c;
        pendingProgram = std::string(prog);
        continue;
      }
      if (t[0] == "nThread") {
        DLOPT_RETURN_IF_ERROR(begin(lineNo));
        continue;
      }
      if (t[0] == "Collective" && t.size() >= 3 && t[2] == "concluded:") {
        DLOPT_RETURN_IF_ERROR(finish());
        continue;
      }
      if (t[0] == "Out" && t.size() >= 6 && t[1] == "of" && t[2] == "bounds" &&
          t.back() != "OK")
        return Status::error(at(lineNo) +
                             "the test reports wrong values "
                             "(" +
                             shown(line) + ")");
      if (t[0] == "Rank" && t.size() >= 2 && allDigits(t[1])) {
        if (!cur)
          DLOPT_RETURN_IF_ERROR(begin(lineNo));
        if (!cur->rows.empty())
          return Status::error(at(lineNo) +
                               "a rank listed after the test's rows");
        const int64_t rank =
            std::strtoll(std::string(t[1]).c_str(), nullptr, 10);
        std::string host;
        size_t devAt = t.size();
        for (size_t i = 2; i + 1 < t.size(); ++i) {
          if (t[i] == "on" && host.empty())
            host = std::string(t[i + 1]);
          if (t[i] == "device") {
            devAt = i;
            break;
          }
        }
        if (host.empty())
          return Status::error(at(lineNo) +
                               "expected '# Rank N ... on HOST device D', "
                               "got '" +
                               shown(line) + "'");
        if (cur->hostOfRank.size() >= kMaxRanks)
          return Status::error(at(lineNo) + "more than 2^20 ranks");
        if (!cur->hostOfRank.emplace(rank, host).second)
          return Status::error(
              at(lineNo) + "rank " + std::to_string(rank) +
              " is listed twice: every process ran its own test (nccl-tests "
              "built without MPI=1 under mpirun?)");
        if (rank == 0 && devAt + 2 < t.size()) {
          // "device 0 [0000:04:00] NVIDIA H100 80GB HBM3"
          size_t k = devAt + 2;
          if (t[k].front() == '[')
            ++k;
          for (; k < t.size(); ++k)
            cur->device += (cur->device.empty() ? "" : " ") + std::string(t[k]);
        }
        continue;
      }
      continue; // other header lines: options, column titles, summaries
    }
    if (!allDigits(t[0]))
      continue; // a launcher's or the library's message
    // A result row: size count type redop root, then the out-of-place
    // time algbw busbw #wrong (and the in-place four).
    if (!cur)
      return Status::error(at(lineNo) + "a result row before the test's "
                                        "header ('# nThread ...') and rank "
                                        "list");
    if (cur->hostOfRank.empty())
      return Status::error(at(lineNo) + "a result row before the test's "
                                        "rank list ('#  Rank 0 ... on HOST "
                                        "device 0 ...')");
    if (t.size() < 9)
      return Status::error(at(lineNo) +
                           "expected 'size count type redop root time algbw "
                           "busbw #wrong ...', got '" +
                           shown(line) + "'");
    if (!cur->collective)
      return Status::error(
          at(lineNo) + "which collective is this? The output has no '# "
                       "Collective test starting: X_perf' line (nccl-tests "
                       "before 2.17) and the file name does not say: name it "
                       "as --nccl-tests all_reduce=FILE");
    const int n = int(cur->hostOfRank.size());
    if (n < 2)
      return Status::error(at(lineNo) + "a test over one rank measures no "
                                        "communication");
    const int64_t maxRank = cur->hostOfRank.rbegin()->first;
    if (maxRank != n - 1)
      return Status::error(at(cur->line) + "expected ranks 0 to " +
                           std::to_string(n - 1) + ", got rank " +
                           std::to_string(maxRank));
    const std::optional<double> size = number(t[0]);
    const std::optional<double> time = number(t[5]);
    const std::optional<double> algbw = number(t[6]);
    const std::optional<double> busbw = number(t[7]);
    if (!size || !time || !algbw || !busbw || !(*time >= 0) || !(*algbw >= 0) ||
        !(*busbw >= 0))
      return Status::error(at(lineNo) +
                           "expected numbers for size, time, algbw and "
                           "busbw, got '" +
                           shown(line) + "'");
    const std::string_view wrong = t[8];
    if (wrong != "0" && wrong != "N/A")
      return Status::error(at(lineNo) + "the test counted " + shown(wrong) +
                           " wrong values at this size: its timings are not "
                           "those of a working collective");
    if (*size == 0)
      continue; // nccl-tests -b 0: nothing moved
    if (*size > double(int64_t(1) << 50))
      return Status::error(at(lineNo) +
                           "expected a size up to 2^50 bytes, "
                           "got " +
                           shown(t[0]));
    if (!(*time > 0))
      return Status::error(at(lineNo) + "expected a time > 0 us, got " +
                           shown(t[5]));
    // The columns agree with one another where their two decimals carry
    // the figures: algbw is size / time, busbw the collective's factor
    // over n ranks times algbw.
    if (*algbw >= 1.0) {
      const double algFromTime = *size / (*time * 1e3);
      if (std::abs(algFromTime / *algbw - 1) > 0.03)
        return Status::error(at(lineNo) + "algbw " + shown(t[6]) +
                             " GB/s is not size / time (" + g3(algFromTime) +
                             " GB/s): the columns are not nccl-tests' size, "
                             "count, type, redop, root, time (us), algbw, "
                             "busbw");
      const double want = busFactor(*cur->collective, n);
      const double got = *busbw / *algbw;
      if (std::abs(got / want - 1) > 0.03)
        return Status::error(at(lineNo) + "busbw / algbw is " + g3(got) +
                             ", expected " + g3(want) + " for " +
                             collectiveTableName(*cur->collective) + " over " +
                             std::to_string(n) + " ranks: is this " +
                             collectiveTableName(*cur->collective) +
                             "_perf's output, and the rank list the test's?");
    }
    if (!cur->sizes.insert(*size).second)
      return Status::error(at(lineNo) + "size " + shown(t[0]) +
                           " appears twice in the test starting at line " +
                           std::to_string(cur->line));
    cur->rows.push_back({*size, *time * 1e-6});
  }
  DLOPT_RETURN_IF_ERROR(finish());
  if (out.empty())
    return Status::error(src + ": no nccl-tests output found (expected a "
                               "'# nThread ...' header, the '#  Rank ...' "
                               "list and result rows)");
  return out;
}

} // namespace dlopt::planner
