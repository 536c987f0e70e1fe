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

/// A finite decimal number (digits, a point, an exponent) that is the
/// whole token: not hex, inf or nan.
std::optional<double> number(std::string_view s) {
  if (s.empty() || s.size() > 40 ||
      !std::all_of(s.begin(), s.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c)) || c == '.' ||
               c == 'e' || c == 'E' || c == '+' || c == '-';
      }))
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

/// The line without a launcher's prefix: `srun -l`'s "12: " and `mpirun
/// --tag-output`'s "[1,0]<stdout>:".
std::string_view unprefixed(std::string_view line) {
  size_t i = 0;
  while (i < line.size() && line[i] == ' ')
    ++i;
  size_t j = i;
  while (j < line.size() && std::isdigit(static_cast<unsigned char>(line[j])))
    ++j;
  if (j > i && j < line.size() && line[j] == ':')
    return line.substr(j + 1);
  if (i < line.size() && line[i] == '[') {
    const size_t close = line.find("]<std", i);
    if (close != std::string_view::npos) {
      const size_t colon = line.find(">:", close);
      if (colon != std::string_view::npos)
        return line.substr(colon + 2);
    }
  }
  return line;
}

constexpr size_t kMaxRanks = size_t(1) << 20;

struct RankEntry {
  std::string host;
  int64_t group = 0;
};

struct Section {
  int line = 0;
  std::optional<Collective> collective;
  std::map<int64_t, RankEntry> ranks;
  std::string device;
  std::vector<std::pair<double, double>> rows; ///< bytes, seconds
  std::set<double> sizes;
  // Rank 0's group, settled at the first row.
  int n = 0, nodes = 0, perNode = 0, groups = 0;
};

} // namespace

std::optional<Collective> collectiveOfNcclTestsName(std::string_view name) {
  const size_t slash = name.find_last_of('/');
  if (slash != std::string_view::npos)
    name = name.substr(slash + 1);
  std::vector<std::string> words;
  std::string w;
  for (char c : name) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      w += char(std::tolower(static_cast<unsigned char>(c)));
    } else if (!w.empty()) {
      words.push_back(w);
      w.clear();
    }
  }
  if (!w.empty())
    words.push_back(w);
  const std::pair<const char *, Collective> known[] = {
      {"all reduce", Collective::AllReduce},
      {"allreduce", Collective::AllReduce},
      {"all gather", Collective::AllGather},
      {"allgather", Collective::AllGather},
      {"reduce scatter", Collective::ReduceScatter},
      {"reducescatter", Collective::ReduceScatter},
      {"alltoall", Collective::AllToAll},
      {"all to all", Collective::AllToAll},
      {"broadcast", Collective::Broadcast}};
  std::set<Collective> found;
  for (size_t i = 0; i < words.size(); ++i)
    for (const auto &[k, c] : known) {
      // k's words at i.
      std::string_view rest = k;
      size_t j = i;
      bool match = true;
      while (!rest.empty()) {
        const size_t sp = rest.find(' ');
        std::string_view part = rest.substr(0, sp);
        if (j >= words.size() || words[j] != part) {
          match = false;
          break;
        }
        ++j;
        rest = sp == std::string_view::npos ? "" : rest.substr(sp + 1);
      }
      if (match)
        found.insert(c);
    }
  if (found.size() != 1)
    return std::nullopt;
  return *found.begin();
}

Expected<std::vector<NcclTestsSweep>>
parseNcclTests(std::string_view text, std::string_view source,
               const NcclTestsNames &names) {
  const std::string src(source);
  std::vector<NcclTestsSweep> out;
  std::optional<Section> cur;
  std::optional<Collective> pending; // from "Collective test starting"
  std::string pendingProgram;
  int lineNo = 0;
  auto at = [&](int line) { return src + ":" + std::to_string(line) + ": "; };
  const char *kNoMpi = " (under mpirun, nccl-tests built without MPI=1 "
                       "runs a test of its own in each process)";
  const char *kSecond = ": did that test fail, or did several processes "
                        "each run a test of their own (nccl-tests built "
                        "without MPI=1 under mpirun)?";

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
    sw.ranks = s.n;
    sw.nodes = s.nodes;
    sw.ranksPerNode = s.perNode;
    sw.groups = s.groups;
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
      r.device = sw.device;
      sw.rows.push_back(r);
    }
    // The same measurement twice in one file: every process printed its
    // own test, or two runs were concatenated.
    for (const NcclTestsSweep &o : out)
      if (o.collective == sw.collective && o.ranks == sw.ranks &&
          o.nodes == sw.nodes && o.ranksPerNode == sw.ranksPerNode)
        for (const CollectiveTableRow &a : o.rows)
          for (const CollectiveTableRow &b : sw.rows)
            if (a.bytes == b.bytes)
              return Status::error(
                  at(sw.line) + "this test measures " +
                  collectiveTableName(sw.collective) +
                  " over the group of "
                  "the test at line " +
                  std::to_string(o.line) + " at the same size (" + g3(a.bytes) +
                  " bytes): two runs in one file (split it)" + kNoMpi);
    out.push_back(std::move(sw));
    return Status::ok();
  };
  auto begin = [&](int line) -> Status {
    if (cur && cur->rows.empty())
      return Status::error(at(line) +
                           "a second test header before the rows of the "
                           "test at line " +
                           std::to_string(cur->line) + kSecond);
    DLOPT_RETURN_IF_ERROR(finish());
    cur.emplace();
    cur->line = line;
    if (pending) {
      if (names.prefix && *names.prefix != *pending)
        return Status::error(at(line) + "the output is " + pendingProgram +
                             "'s, but the file was named " +
                             collectiveTableName(*names.prefix) + "=");
      cur->collective = pending;
    } else {
      cur->collective = names.prefix ? names.prefix : names.fileName;
    }
    pending.reset();
    pendingProgram.clear();
    return Status::ok();
  };
  // Rank 0's group, once the rank list is complete (at the first row).
  auto settle = [&](Section &s) -> Status {
    if (s.n > 0)
      return Status::ok();
    const int64_t total = int64_t(s.ranks.size());
    const int64_t maxRank = s.ranks.rbegin()->first;
    if (maxRank != total - 1)
      return Status::error(at(s.line) + "expected ranks 0 to " +
                           std::to_string(total - 1) + ", got rank " +
                           std::to_string(maxRank));
    const int64_t group0 = s.ranks.at(0).group;
    std::map<std::string, int> perHost;
    std::set<int64_t> groups;
    for (const auto &[rank, e] : s.ranks) {
      groups.insert(e.group);
      if (e.group == group0) {
        ++s.n;
        ++perHost[e.host];
      }
    }
    s.groups = int(groups.size());
    s.nodes = int(perHost.size());
    for (const auto &[host, k] : perHost)
      s.perNode = std::max(s.perNode, k);
    if (s.n < 2)
      return Status::error(at(s.line) +
                           "a test over one rank measures no "
                           "communication" +
                           (s.groups > 1 ? std::string(" (rank 0's group "
                                                       "has one rank)")
                                         : std::string(kNoMpi)));
    return Status::ok();
  };

  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos)
      eol = text.size();
    std::string_view line = unprefixed(text.substr(pos, eol - pos));
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
        // X_perf, or X_perf_mpi and other NAME_SUFFIX builds.
        std::string_view name = prog.substr(0, prog.find("_perf"));
        Collective c;
        if (!collectiveFromTableName(name, c))
          return Status::error(
              at(lineNo) + "'" + shown(prog) +
              "' measures no collective dlopt prices (all_reduce_perf, "
              "all_gather_perf, reduce_scatter_perf, alltoall_perf, "
              "broadcast_perf)");
        if (cur && cur->rows.empty() && !cur->ranks.empty())
          return Status::error(at(lineNo) +
                               "a second test header before the rows of the "
                               "test at line " +
                               std::to_string(cur->line) + kSecond);
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
      if (t[0] == "size" && t.size() >= 3 && t[1] == "count") {
        // The column titles: the format this reader knows.
        const bool cputime =
            std::find(t.begin(), t.end(), "cputime") != t.end();
        const bool wrong = std::find(t.begin(), t.end(), "#wrong") != t.end();
        if (cputime)
          return Status::error(at(lineNo) + "the output has CPU times "
                                            "(nccl-tests -C 1); run it "
                                            "without -C");
        if (!wrong)
          return Status::error(at(lineNo) +
                               "expected the columns of nccl-tests 2.13 and "
                               "later ('size count type redop root time algbw "
                               "busbw #wrong ...'), got '" +
                               shown(line) + "'");
        continue;
      }
      if (t[0] == "Rank" && t.size() >= 2 && allDigits(t[1])) {
        if (!cur)
          DLOPT_RETURN_IF_ERROR(begin(lineNo));
        if (!cur->rows.empty())
          return Status::error(at(lineNo) +
                               "a rank listed after the test's rows");
        const int64_t rank =
            std::strtoll(std::string(t[1]).c_str(), nullptr, 10);
        RankEntry e;
        size_t devAt = t.size();
        if (t.size() >= 4 && t[2] == "Group" && allDigits(t[3]))
          e.group = std::strtoll(std::string(t[3]).c_str(), nullptr, 10);
        for (size_t i = 2; i + 1 < t.size(); ++i) {
          if (t[i] == "on" && e.host.empty())
            e.host = std::string(t[i + 1]);
          if (t[i] == "device") {
            devAt = i;
            break;
          }
        }
        if (e.host.empty())
          return Status::error(at(lineNo) +
                               "expected '# Rank N ... on HOST device D', "
                               "got '" +
                               shown(line) + "'");
        if (cur->ranks.size() >= kMaxRanks)
          return Status::error(at(lineNo) + "more than 2^20 ranks");
        if (!cur->ranks.emplace(rank, e).second)
          return Status::error(at(lineNo) + "rank " + std::to_string(rank) +
                               " is listed twice: every process ran its own "
                               "test" +
                               kNoMpi);
        if (rank == 0 && devAt + 2 < t.size()) {
          // "device 0 [0000:04:00] NVIDIA H100 80GB HBM3"
          size_t k = devAt + 2;
          if (t[k].front() == '[')
            ++k;
          for (; k < t.size() && cur->device.size() < 120; ++k)
            cur->device += (cur->device.empty() ? "" : " ") + shown(t[k]);
        }
        continue;
      }
      continue; // other header lines: options, summaries
    }
    if (!allDigits(t[0]))
      continue; // a launcher's or the library's message
    // A result row: size count type redop root, then the out-of-place
    // time algbw busbw #wrong (and the in-place four).
    if (!cur)
      return Status::error(at(lineNo) + "a result row before the test's "
                                        "header ('# nThread ...') and rank "
                                        "list");
    if (cur->ranks.empty())
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
                       "before 2.16.7) and the file name does not say: name "
                       "it as --nccl-tests all_reduce=FILE");
    DLOPT_RETURN_IF_ERROR(settle(*cur));
    const int n = cur->n;
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
    if (!(*time >= 0.01))
      return Status::error(at(lineNo) +
                           "expected a time of at least 0.01 "
                           "us, got " +
                           shown(t[5]));
    // The columns agree with one another, to their printed digits: algbw
    // (two decimals) is size / time (time to at least three digits: 1%);
    // busbw is the collective's factor over the group times algbw.
    const double algFromTime = *size / (*time * 1e3);
    if (std::abs(algFromTime - *algbw) > 0.0051 + 0.01 * *algbw)
      return Status::error(at(lineNo) + "algbw " + shown(t[6]) +
                           " GB/s is not size / time (" + g3(algFromTime) +
                           " GB/s): the columns are not nccl-tests' size, "
                           "count, type, redop, root, time (us), algbw, "
                           "busbw");
    const double want = busFactor(*cur->collective, n);
    if (std::abs(*busbw - want * *algbw) > 0.0051 * (1 + want))
      return Status::error(at(lineNo) + "busbw / algbw is " +
                           g3(*busbw / *algbw) + ", expected " + g3(want) +
                           " for " + collectiveTableName(*cur->collective) +
                           " over " + std::to_string(n) + " ranks: is this " +
                           collectiveTableName(*cur->collective) +
                           "_perf's output, and the rank list the test's?");
    if (!cur->sizes.insert(*size).second)
      return Status::error(
          at(lineNo) + "size " + shown(t[0]) +
          " appears twice in the test starting at line " +
          std::to_string(cur->line) +
          " (several data types, operations or roots in one test: -d all, "
          "-o all, -r -1 or -N; run one of each)");
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
