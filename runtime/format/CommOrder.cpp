//===- CommOrder.cpp - Proof that a multi-rank executable cannot deadlock --===//
#include "runtime/format/CommOrder.h"

#include <map>
#include <string>
#include <vector>

namespace dlopt::rt {
namespace {

/// One communication instruction of one rank.
struct Event {
  int32_t instr = 0;   ///< index in the rank's program
  int32_t comm = -1;   ///< communicator instance (collectives)
  int32_t peer = -1;   ///< the other rank (send, recv)
  bool send = false, recv = false;
};

std::string describe(const Executable &exe, int32_t program, const Event &e) {
  const Instr &in = exe.programs[size_t(program)].instrs[size_t(e.instr)];
  return "'" + in.op + "' (instruction " + std::to_string(e.instr) +
         (in.loc.empty() ? "" : " at " + in.loc) + ")";
}

/// Two ranks' k-th collectives on one communicator must be the same
/// operation: the op, its attributes (the location is not one), and the
/// operand's type (every rank passes a block of the same shape).
bool sameCollective(const Executable &exe, const Instr &a, const Instr &b) {
  return a.op == b.op && a.attrs == b.attrs &&
         exe.values[size_t(a.operands[0])].type ==
             exe.values[size_t(b.operands[0])].type;
}

/// The same, as text for a message.
std::string signature(const Executable &exe, const Instr &in) {
  std::string s = in.op;
  for (const auto &[k, v] : in.attrs) {
    s += " " + k + "=";
    if (const auto *i = std::get_if<int64_t>(&v))
      s += std::to_string(*i);
    else if (const auto *d = std::get_if<double>(&v))
      s += std::to_string(*d);
    else if (const auto *str = std::get_if<std::string>(&v))
      s += *str;
    else
      s += "[..]";
  }
  if (!in.operands.empty())
    s += " of " + exe.values[size_t(in.operands[0])].type.str();
  return s;
}

} // namespace

Status checkCommunicationOrder(const Executable &exe) {
  const int32_t world = exe.worldSize;
  std::vector<int32_t> programOf(static_cast<size_t>(world), -1);
  for (size_t p = 0; p < exe.programs.size(); ++p)
    for (int32_t r : exe.programs[p].ranks)
      programOf[size_t(r)] = int32_t(p);

  // Bounded work: one event per communication instruction per rank.
  int64_t total = 0;
  for (const Program &p : exe.programs) {
    int64_t n = 0;
    for (const Instr &in : p.instrs)
      n += isCommunicationOp(in.op) ? 1 : 0;
    total += n * int64_t(p.ranks.size());
  }
  if (total == 0)
    return Status::ok();
  constexpr int64_t kMaxEvents = int64_t(1) << 26;
  if (total > kMaxEvents)
    return Status::error("the ranks issue " + std::to_string(total) +
                         " communication instructions in all, more than the " +
                         std::to_string(kMaxEvents) +
                         " the deadlock check replays");

  // Communicator instances: (group kind, first rank of the group); no
  // group is listed more than once.
  std::map<std::pair<int32_t, int32_t>, int32_t> commIds;
  std::vector<std::vector<int32_t>> commRanks;
  std::vector<std::vector<Event>> events(static_cast<size_t>(world));
  for (int32_t r = 0; r < world; ++r) {
    int32_t p = programOf[size_t(r)];
    const Program &prog = exe.programs[size_t(p)];
    for (size_t i = 0; i < prog.instrs.size(); ++i) {
      const Instr &in = prog.instrs[i];
      if (!isCommunicationOp(in.op) || in.op == "all_slice")
        continue; // all_slice moves nothing and waits for no one
      int32_t group = int32_t(in.getInt("group", -1));
      if (group < 0 || size_t(group) >= exe.groups.size())
        return Status::error("rank " + std::to_string(r) + ": '" + in.op +
                             "' names no valid group");
      int64_t size = exe.groupSize(group);
      Event e;
      e.instr = int32_t(i);
      if (in.op == "send" || in.op == "recv") {
        int64_t peer = in.getInt("peer", -1);
        if (peer < 0 || peer >= size)
          return Status::error("rank " + std::to_string(r) + ": " +
                               describe(exe, p, e) + " names peer " +
                               std::to_string(peer) + ", outside its group of " +
                               std::to_string(size));
        e.peer = exe.groupMember(group, r, peer);
        if (e.peer == r)
          return Status::error("rank " + std::to_string(r) + ": " +
                               describe(exe, p, e) +
                               " names the rank itself as its peer");
        e.send = in.op == "send";
        e.recv = !e.send;
      } else {
        auto key = std::make_pair(group, exe.groupMember(group, r, 0));
        auto it = commIds.find(key);
        if (it == commIds.end()) {
          it = commIds.emplace(key, int32_t(commRanks.size())).first;
          commRanks.push_back(exe.groupRanks(group, r));
        }
        e.comm = it->second;
      }
      events[size_t(r)].push_back(e);
    }
  }

  // Replay: every rank runs until its next communication blocks.
  std::vector<size_t> pc(static_cast<size_t>(world), 0);
  std::vector<std::vector<int32_t>> arrived(commRanks.size());
  std::vector<int32_t> work;
  for (int32_t r = 0; r < world; ++r)
    work.push_back(r);
  auto at = [&](int32_t r) -> const Event * {
    return pc[size_t(r)] < events[size_t(r)].size()
               ? &events[size_t(r)][pc[size_t(r)]]
               : nullptr;
  };
  auto instrOf = [&](int32_t r, const Event &e) -> const Instr & {
    return exe.programs[size_t(programOf[size_t(r)])].instrs[size_t(e.instr)];
  };
  std::vector<bool> waiting(static_cast<size_t>(world), false);
  while (!work.empty()) {
    int32_t r = work.back();
    work.pop_back();
    const Event *e = at(r);
    if (!e || waiting[size_t(r)])
      continue;
    if (e->send || e->recv) {
      const Event *o = at(e->peer);
      bool match = o && waiting[size_t(e->peer)] && o->peer == r &&
                   (e->send ? o->recv : o->send);
      if (!match) {
        waiting[size_t(r)] = true;
        continue;
      }
      const Event &s = e->send ? *e : *o, &v = e->send ? *o : *e;
      int32_t sr = e->send ? r : e->peer, vr = e->send ? e->peer : r;
      const Instr &si = instrOf(sr, s), &vi = instrOf(vr, v);
      const TensorType &st = exe.values[size_t(si.operands[0])].type;
      const TensorType &vt = exe.values[size_t(vi.results[0])].type;
      if (!(st == vt))
        return Status::error(
            "rank " + std::to_string(sr) + " sends a " + st.str() + " with " +
            describe(exe, programOf[size_t(sr)], s) + " to rank " +
            std::to_string(vr) + ", which receives a " + vt.str() + " with " +
            describe(exe, programOf[size_t(vr)], v));
      waiting[size_t(e->peer)] = false;
      ++pc[size_t(r)];
      ++pc[size_t(e->peer)];
      work.push_back(r);
      work.push_back(e->peer);
      continue;
    }
    std::vector<int32_t> &here = arrived[size_t(e->comm)];
    here.push_back(r);
    waiting[size_t(r)] = true;
    const std::vector<int32_t> &members = commRanks[size_t(e->comm)];
    if (here.size() < members.size())
      continue;
    // Every rank of the communicator is at its next collective on it.
    const int32_t first = members.front();
    const Instr &want = instrOf(first, *at(first));
    for (int32_t m : members) {
      const Instr &got = instrOf(m, *at(m));
      if (!sameCollective(exe, want, got))
        return Status::error(
            "the ranks of one communicator disagree on their next "
            "collective: rank " + std::to_string(first) + " runs " +
            describe(exe, programOf[size_t(first)], *at(first)) + " (" +
            signature(exe, want) + "), rank " + std::to_string(m) + " runs " +
            describe(exe, programOf[size_t(m)], *at(m)) + " (" +
            signature(exe, got) + ")");
    }
    for (int32_t m : members) {
      waiting[size_t(m)] = false;
      ++pc[size_t(m)];
      work.push_back(m);
    }
    here.clear();
  }

  // Whoever still waits waits forever.
  std::string stuck;
  int shown = 0;
  for (int32_t r = 0; r < world && shown < 4; ++r) {
    const Event *e = at(r);
    if (!e)
      continue;
    std::string what = "rank " + std::to_string(r) + " waits in " +
                       describe(exe, programOf[size_t(r)], *e);
    if (e->send || e->recv) {
      const Event *o = at(e->peer);
      what += std::string(e->send ? " to send to" : " to receive from") +
              " rank " + std::to_string(e->peer) +
              (o ? ", which waits in " +
                       describe(exe, programOf[size_t(e->peer)], *o)
                 : ", which has finished its program");
    } else {
      const std::vector<int32_t> &members = commRanks[size_t(e->comm)];
      std::string missing;
      for (int32_t m : members) {
        const Event *o = at(m);
        if (!o || o->comm != e->comm)
          missing += (missing.empty() ? "" : ", ") + std::to_string(m) +
                     (o ? "" : " (finished)");
      }
      what += " for rank(s) " + missing + " of its group";
    }
    stuck += (stuck.empty() ? "" : "; ") + what;
    ++shown;
  }
  if (stuck.empty())
    return Status::ok();
  return Status::error("the programs can deadlock (assuming a send waits for "
                       "its receive): " + stuck);
}

} // namespace dlopt::rt
