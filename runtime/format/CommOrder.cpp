//===- CommOrder.cpp - Proof that a multi-rank executable cannot deadlock --===//
#include "runtime/format/CommOrder.h"

#include <map>
#include <set>
#include <string>
#include <vector>

namespace dlopt::rt {
namespace {

/// One point-to-point transfer of a batch: a send of operand `index`, or a
/// receive into result `index`.
struct P2P {
  bool send = false;
  int32_t index = 0;
  int32_t peer = -1;    ///< the other rank
  int32_t partner = -1; ///< the peer's step that holds the matching transfer
};

/// One communication instruction of one rank: a collective, or a batch of
/// point-to-point transfers (a send or recv is a batch of one; send_recv
/// posts all of its transfers together, as NCCL's grouped calls do).
struct Event {
  int32_t instr = 0;   ///< index in the rank's program
  int32_t comm = -1;   ///< communicator instance (collectives)
  std::vector<P2P> p2p;
  bool isP2P() const { return comm < 0; }
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
      auto peerOf = [&](int64_t peer) -> Expected<int32_t> {
        if (peer < 0 || peer >= size)
          return Status::error("rank " + std::to_string(r) + ": " +
                               describe(exe, p, e) + " names peer " +
                               std::to_string(peer) + ", outside its group of " +
                               std::to_string(size));
        int32_t q = exe.groupMember(group, r, peer);
        if (q == r)
          return Status::error("rank " + std::to_string(r) + ": " +
                               describe(exe, p, e) +
                               " names the rank itself as its peer");
        return q;
      };
      if (in.op == "send" || in.op == "recv" || in.op == "send_recv") {
        std::vector<std::pair<bool, int64_t>> transfers;
        if (in.op == "send_recv") {
          Expected<std::vector<int64_t>> sp = in.getInts("send_peers"),
                                         rp = in.getInts("recv_peers");
          if (!sp || !rp)
            return Status::error("rank " + std::to_string(r) + ": " +
                                 describe(exe, p, e) + ": " +
                                 (!sp ? sp.status() : rp.status()).message());
          for (int64_t q : *sp)
            transfers.push_back({true, q});
          for (int64_t q : *rp)
            transfers.push_back({false, q});
        } else {
          transfers.push_back({in.op == "send", in.getInt("peer", -1)});
        }
        int32_t sends = 0, recvs = 0;
        for (auto [isSend, peer] : transfers) {
          Expected<int32_t> q = peerOf(peer);
          if (!q)
            return q.status();
          P2P t;
          t.send = isSend;
          t.index = isSend ? sends++ : recvs++;
          t.peer = *q;
          e.p2p.push_back(t);
        }
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

  auto instrOf = [&](int32_t r, const Event &e) -> const Instr & {
    return exe.programs[size_t(programOf[size_t(r)])].instrs[size_t(e.instr)];
  };

  // Pairing: the k-th send from a to b meets the k-th receive on b from a
  // (FIFO per ordered pair of ranks), of the same type.
  {
    struct Ref {
      int32_t step, transfer;
    };
    std::map<std::pair<int32_t, int32_t>, std::vector<Ref>> sends, recvs;
    for (int32_t r = 0; r < world; ++r)
      for (size_t s = 0; s < events[size_t(r)].size(); ++s) {
        const Event &e = events[size_t(r)][s];
        for (size_t t = 0; t < e.p2p.size(); ++t) {
          const P2P &x = e.p2p[t];
          auto key = x.send ? std::make_pair(r, x.peer) : std::make_pair(x.peer, r);
          (x.send ? sends : recvs)[key].push_back({int32_t(s), int32_t(t)});
        }
      }
    auto typeOf = [&](int32_t r, const Ref &ref, bool send) -> const TensorType & {
      const Event &e = events[size_t(r)][size_t(ref.step)];
      const Instr &in = instrOf(r, e);
      int32_t idx = e.p2p[size_t(ref.transfer)].index;
      return exe.values[size_t(send ? in.operands[size_t(idx)]
                                    : in.results[size_t(idx)])]
          .type;
    };
    auto unpaired = [&](int32_t r, const Ref &ref, bool send, int32_t peer) {
      const Event &e = events[size_t(r)][size_t(ref.step)];
      return Status::error(
          std::string("the programs can deadlock (assuming a send waits for "
                      "its receive): rank ") +
          std::to_string(r) + (send ? " sends to" : " receives from") +
          " rank " + std::to_string(peer) + " with " +
          describe(exe, programOf[size_t(r)], e) + ", and rank " +
          std::to_string(peer) + " has no matching " +
          (send ? "receive" : "send") + " left");
    };
    std::set<std::pair<int32_t, int32_t>> keys;
    for (const auto &kv : sends)
      keys.insert(kv.first);
    for (const auto &kv : recvs)
      keys.insert(kv.first);
    for (const auto &key : keys) {
      const std::vector<Ref> &ss = sends[key], &rs = recvs[key];
      auto [a, b] = key;
      for (size_t k = 0; k < std::max(ss.size(), rs.size()); ++k) {
        if (k >= rs.size())
          return unpaired(a, ss[k], true, b);
        if (k >= ss.size())
          return unpaired(b, rs[k], false, a);
        const TensorType &st = typeOf(a, ss[k], true), &vt = typeOf(b, rs[k], false);
        const Event &se = events[size_t(a)][size_t(ss[k].step)];
        const Event &ve = events[size_t(b)][size_t(rs[k].step)];
        if (!(st == vt))
          return Status::error(
              "rank " + std::to_string(a) + " sends a " + st.str() + " with " +
              describe(exe, programOf[size_t(a)], se) + " to rank " +
              std::to_string(b) + ", which receives a " + vt.str() + " with " +
              describe(exe, programOf[size_t(b)], ve));
        events[size_t(a)][size_t(ss[k].step)].p2p[size_t(ss[k].transfer)].partner =
            rs[k].step;
        events[size_t(b)][size_t(rs[k].step)].p2p[size_t(rs[k].transfer)].partner =
            ss[k].step;
      }
    }
  }

  // Replay: every rank runs until its next communication blocks. A batch
  // of transfers completes once every peer has posted its side (reached
  // the step holding the matching transfer); a collective once every rank
  // of its communicator has reached it.
  std::vector<size_t> pc(static_cast<size_t>(world), 0);
  std::vector<std::vector<int32_t>> arrived(commRanks.size());
  std::vector<bool> inCollective(static_cast<size_t>(world), false);
  std::vector<int32_t> work;
  for (int32_t r = 0; r < world; ++r)
    work.push_back(r);
  auto at = [&](int32_t r) -> const Event * {
    return pc[size_t(r)] < events[size_t(r)].size()
               ? &events[size_t(r)][pc[size_t(r)]]
               : nullptr;
  };
  auto advance = [&](int32_t r) {
    ++pc[size_t(r)];
    work.push_back(r);
    // Peers of the step r now posts may have been waiting for it.
    if (const Event *n = at(r))
      for (const P2P &t : n->p2p)
        work.push_back(t.peer);
  };
  while (!work.empty()) {
    int32_t r = work.back();
    work.pop_back();
    const Event *e = at(r);
    if (!e || inCollective[size_t(r)])
      continue;
    if (e->isP2P()) {
      bool ready = true;
      for (const P2P &t : e->p2p)
        ready = ready && pc[size_t(t.peer)] >= size_t(t.partner);
      if (ready)
        advance(r);
      continue;
    }
    std::vector<int32_t> &here = arrived[size_t(e->comm)];
    here.push_back(r);
    inCollective[size_t(r)] = true;
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
    here.clear();
    for (int32_t m : members) {
      inCollective[size_t(m)] = false;
      advance(m);
    }
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
    if (e->isP2P()) {
      for (const P2P &t : e->p2p) {
        if (pc[size_t(t.peer)] >= size_t(t.partner))
          continue;
        const Event *o = at(t.peer);
        what += std::string(t.send ? " to send to" : " to receive from") +
                " rank " + std::to_string(t.peer) +
                (o ? ", which waits in " +
                         describe(exe, programOf[size_t(t.peer)], *o)
                   : ", which has finished its program");
        break;
      }
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
