//===- MemoryPlanner.cpp - Arena offsets from buffer lifetimes ------------===//
//
// Greedy packing: each buffer goes into the smallest gap between already
// placed buffers whose lifetimes overlap its own (best fit), or on top of
// them if no gap is big enough. Two placement orders are tried:
//   - by size, largest first (large buffers are the hard ones to fit; small
//     ones fill the holes they leave);
//   - by breadth (TFLite's "greedy by breadth"): the instructions by the
//     bytes live at them, largest first, each one's buffers not yet placed,
//     largest first. It places the peak's buffers first and packs them
//     tight, which the size order can miss in a training step, where
//     activations die as weight gradients are born: gpt3-175b's AdamW
//     step at batch 4 planned 699.4 GiB of scratch by size for a 657.4 GiB
//     peak, and exactly the peak by breadth.
// The order by breadth runs only when the size order's arena exceeds the
// live peak (the lower bound); the smaller arena wins, the size order on a
// tie. Ties within an order are broken by index, so the result depends
// only on the input.
//
//===----------------------------------------------------------------------===//

#include "runtime/format/MemoryPlanner.h"

#include <unordered_map>

#include <algorithm>
#include <limits>
#include <numeric>
#include <queue>
#include <set>

namespace dlopt::rt {

namespace {

int64_t alignUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

/// Lifetimes as the planner uses them: sizes clamped at zero and intervals
/// made non-empty, so malformed input cannot break the invariants.
BufferLifetime sanitize(BufferLifetime b) {
  b.size = std::max<int64_t>(b.size, 0);
  b.lastUse = std::max(b.lastUse, b.firstUse);
  return b;
}

} // namespace

MemoryAssignment planMemory(const std::vector<BufferLifetime> &input,
                            int64_t alignment) {
  if (alignment < 1)
    alignment = 1;
  std::vector<BufferLifetime> bufs;
  bufs.reserve(input.size());
  for (const BufferLifetime &b : input)
    bufs.push_back(sanitize(b));

  // Placed buffers in address order (ties: in placement order), so the
  // conflicts of a new buffer come out already in address order. They are
  // kept as compact records in chunks of at most kChunk: scanning them is
  // the inner loop (every placed buffer for every new one), and a chunk
  // keeps insertion cheap.
  struct Placed {
    int64_t offset, end, firstUse, lastUse;
  };
  constexpr size_t kChunk = 256;
  auto place = [&](const std::vector<size_t> &order) {
    MemoryAssignment out;
    out.offsets.assign(bufs.size(), 0);
    std::vector<std::vector<Placed>> chunks;
    int64_t peak = 0;
    for (size_t idx : order) {
      const BufferLifetime &b = bufs[idx];
      if (b.size == 0)
        continue;
      int64_t cursor = 0; // end of the highest conflicting buffer so far
      int64_t bestOffset = -1;
      int64_t bestGap = std::numeric_limits<int64_t>::max();
      for (const std::vector<Placed> &chunk : chunks)
        for (const Placed &o : chunk) {
          if (o.firstUse > b.lastUse || b.firstUse > o.lastUse)
            continue;
          int64_t candidate = alignUp(cursor, alignment);
          if (candidate + b.size <= o.offset && o.offset - cursor < bestGap) {
            bestGap = o.offset - cursor;
            bestOffset = candidate;
          }
          cursor = std::max(cursor, o.end);
        }
      int64_t offset =
          bestOffset >= 0 ? bestOffset : alignUp(cursor, alignment);
      out.offsets[idx] = offset;
      peak = std::max(peak, offset + b.size);
      Placed rec{offset, offset + b.size, b.firstUse, b.lastUse};
      // Insert after every record at or below this offset.
      size_t c = 0;
      while (c + 1 < chunks.size() && chunks[c].back().offset <= offset)
        ++c;
      if (chunks.empty())
        chunks.emplace_back();
      std::vector<Placed> &chunk = chunks[c];
      auto pos = std::upper_bound(
          chunk.begin(), chunk.end(), offset,
          [](int64_t off, const Placed &p) { return off < p.offset; });
      chunk.insert(pos, rec);
      if (chunk.size() > 2 * kChunk) {
        std::vector<Placed> upper(chunk.begin() + kChunk, chunk.end());
        chunk.resize(kChunk);
        chunks.insert(chunks.begin() + c + 1, std::move(upper));
      }
    }
    out.peakBytes = alignUp(peak, alignment);
    return out;
  };

  // By size: largest first; equal sizes, the longer lifetime, then the
  // earlier.
  std::vector<size_t> bySize(bufs.size());
  std::iota(bySize.begin(), bySize.end(), 0);
  std::stable_sort(bySize.begin(), bySize.end(), [&](size_t a, size_t b) {
    const BufferLifetime &x = bufs[a], &y = bufs[b];
    if (x.size != y.size)
      return x.size > y.size;
    int64_t lx = x.lastUse - x.firstUse, ly = y.lastUse - y.firstUse;
    if (lx != ly)
      return lx > ly;
    return x.firstUse < y.firstUse;
  });
  MemoryAssignment result = place(bySize);

  // The live peak: the bytes live at the worst instruction (it is a
  // buffer's first use), a lower bound on any arena.
  std::vector<int64_t> starts; // the candidate instructions, ascending
  for (const BufferLifetime &b : bufs)
    if (b.size > 0)
      starts.push_back(b.firstUse);
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  const size_t k = starts.size();
  if (k == 0)
    return result;
  auto indexOf = [&](int64_t t) { // the first candidate >= t
    return size_t(std::lower_bound(starts.begin(), starts.end(), t) -
                  starts.begin());
  };
  auto indexAfter = [&](int64_t t) { // the first candidate > t
    return size_t(std::upper_bound(starts.begin(), starts.end(), t) -
                  starts.begin());
  };
  std::vector<int64_t> breadth(k + 1, 0);
  for (const BufferLifetime &b : bufs)
    if (b.size > 0) {
      breadth[indexOf(b.firstUse)] += b.size;
      breadth[indexAfter(b.lastUse)] -= b.size;
    }
  for (size_t i = 1; i <= k; ++i)
    breadth[i] += breadth[i - 1];
  breadth.pop_back();
  const int64_t live = *std::max_element(breadth.begin(), breadth.end());
  if (result.peakBytes <= alignUp(live, alignment))
    return result;

  // By breadth. Each buffer is listed at the O(log k) nodes of a segment
  // tree over the candidates that cover the candidates it is live at;
  // a point query collects the live buffers not placed yet and drops the
  // placed ones it meets, so every entry is visited O(1) times after it is
  // placed.
  std::vector<size_t> rank(bufs.size());
  for (size_t i = 0; i < bySize.size(); ++i)
    rank[bySize[i]] = i;
  size_t leaves = 1;
  while (leaves < k)
    leaves *= 2;
  std::vector<std::vector<size_t>> tree(2 * leaves);
  for (size_t i = 0; i < bufs.size(); ++i) {
    const BufferLifetime &b = bufs[i];
    if (b.size == 0)
      continue;
    size_t lo = indexOf(b.firstUse) + leaves,
           hi = indexAfter(b.lastUse) + leaves; // [lo, hi)
    for (; lo < hi; lo /= 2, hi /= 2) {
      if (lo & 1)
        tree[lo++].push_back(i);
      if (hi & 1)
        tree[--hi].push_back(i);
    }
  }
  std::vector<size_t> byBreadthInst(k);
  std::iota(byBreadthInst.begin(), byBreadthInst.end(), 0);
  std::stable_sort(byBreadthInst.begin(), byBreadthInst.end(),
                   [&](size_t a, size_t b) { return breadth[a] > breadth[b]; });
  std::vector<char> taken(bufs.size(), 0);
  std::vector<size_t> order, here;
  order.reserve(bufs.size());
  for (size_t c : byBreadthInst) {
    here.clear();
    for (size_t node = c + leaves; node >= 1; node /= 2) {
      std::vector<size_t> &list = tree[node];
      size_t keep = 0;
      for (size_t j = 0; j < list.size(); ++j)
        if (!taken[list[j]]) {
          taken[list[j]] = 1;
          here.push_back(list[j]);
        } // placed entries (and these) leave the list
      list.resize(keep);
    }
    std::sort(here.begin(), here.end(),
              [&](size_t a, size_t b) { return rank[a] < rank[b]; });
    order.insert(order.end(), here.begin(), here.end());
  }
  for (size_t i : bySize) // zero-sized buffers
    if (!taken[i])
      order.push_back(i);
  MemoryAssignment breadthFirst = place(order);
  breadthFirst.byBreadth = true;
  if (breadthFirst.peakBytes < result.peakBytes)
    return breadthFirst;
  return result;
}

std::optional<std::pair<size_t, size_t>>
findMemoryConflict(const std::vector<BufferLifetime> &buffers,
                   const std::vector<int64_t> &offsets) {
  size_t n = std::min(buffers.size(), offsets.size());
  std::vector<size_t> order;
  for (size_t i = 0; i < n; ++i)
    if (buffers[i].size > 0)
      order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return buffers[a].firstUse < buffers[b].firstUse;
  });

  // Live buffers keyed by (offset, index); they never overlap each other,
  // so a new buffer only needs checking against its two address neighbours.
  std::set<std::pair<int64_t, size_t>> live;
  using Ending = std::pair<int64_t, size_t>; // (lastUse, index)
  std::priority_queue<Ending, std::vector<Ending>, std::greater<Ending>> ends;
  auto ordered = [](size_t a, size_t b) {
    return std::make_pair(std::min(a, b), std::max(a, b));
  };
  for (size_t i : order) {
    const BufferLifetime &b = buffers[i];
    while (!ends.empty() && ends.top().first < b.firstUse) {
      live.erase({offsets[ends.top().second], ends.top().second});
      ends.pop();
    }
    int64_t start = offsets[i], end = offsets[i] + b.size;
    auto next = live.lower_bound({start, 0});
    if (next != live.end() && next->first < end)
      return ordered(next->second, i);
    if (next != live.begin()) {
      auto prev = std::prev(next);
      if (prev->first + buffers[prev->second].size > start)
        return ordered(prev->second, i);
    }
    live.insert({start, i});
    ends.push({std::max(b.lastUse, b.firstUse), i});
  }
  return std::nullopt;
}

bool isElementwiseOp(const std::string &op) {
  static const char *const kOps[] = {
      "neg",  "abs",     "relu",    "exp",     "log",     "sqrt", "rsqrt",
      "tanh", "sin",     "cos",     "sigmoid", "silu",    "gelu", "add",
      "sub",  "mul",     "div",     "maximum", "minimum", "pow",  "select",
      "fused_elementwise"};
  for (const char *k : kOps)
    if (op == k)
      return true;
  return false;
}

std::vector<std::pair<int32_t, int32_t>>
findInPlaceUpdates(const Executable &exe, const Program &program) {
  std::vector<std::pair<int32_t, int32_t>> pairs;
  if (exe.outputUpdates.size() != exe.outputs.size())
    return pairs;
  size_t numValues = exe.values.size();
  std::vector<int64_t> defAt(numValues, -1), lastRead(numValues, -1);
  for (size_t i = 0; i < program.instrs.size(); ++i) {
    for (int32_t id : program.instrs[i].operands)
      if (id >= 0 && size_t(id) < numValues)
        lastRead[id] = int64_t(i);
    for (int32_t id : program.instrs[i].results)
      if (id >= 0 && size_t(id) < numValues && defAt[id] < 0)
        defAt[id] = int64_t(i);
  }
  std::unordered_map<std::string, int32_t> argByName;
  for (size_t v = 0; v < numValues; ++v)
    if (exe.values[v].kind == ValueKind::Param ||
        exe.values[v].kind == ValueKind::State)
      argByName.emplace(exe.values[v].name, int32_t(v));
  std::vector<bool> isOutput(numValues, false), taken(numValues, false);
  for (int32_t id : exe.outputs)
    if (id >= 0 && size_t(id) < numValues)
      isOutput[id] = true;
  for (size_t o = 0; o < exe.outputs.size(); ++o) {
    const std::string &target = exe.outputUpdates[o];
    int32_t t = exe.outputs[o];
    if (target.empty() || t < 0 || size_t(t) >= numValues ||
        exe.values[t].kind != ValueKind::Temp || defAt[t] < 0 || taken[t])
      continue;
    auto it = argByName.find(target);
    int32_t a = it == argByName.end() ? -1 : it->second;
    if (a < 0 || isOutput[a] || taken[a] || !(exe.values[a].type == exe.values[t].type))
      continue;
    int64_t d = defAt[t];
    if (lastRead[a] > d)
      continue;
    if (lastRead[a] == d) {
      const Instr &in = program.instrs[d];
      // A fused group reads every operand element before it writes the
      // results' elements at that index, so several results may each take
      // an operand's bytes.
      if (!isElementwiseOp(in.op) ||
          (in.results.size() != 1 && in.op != "fused_elementwise"))
        continue;
      bool sameTyped = true;
      for (int32_t id : in.operands)
        if (id == a && !(exe.values[id].type == exe.values[t].type))
          sameTyped = false;
      if (!sameTyped)
        continue;
      // A multi-tensor group runs its segments concurrently (one CUDA
      // launch): a result may only take the bytes of an operand of its own
      // segment.
      int64_t segs = in.getInt("segments", 1);
      if (segs > 1) {
        if (in.operands.size() % size_t(segs) != 0 ||
            in.results.size() % size_t(segs) != 0)
          continue;
        size_t numIn = in.operands.size() / size_t(segs);
        size_t numOut = in.results.size() / size_t(segs);
        size_t seg = size_t(-1);
        for (size_t j = 0; j < in.results.size(); ++j)
          if (in.results[j] == t)
            seg = j / numOut;
        bool ownSegment = seg != size_t(-1);
        for (size_t j = 0; j < in.operands.size(); ++j)
          if (in.operands[j] == a && j / numIn != seg)
            ownSegment = false;
        if (!ownSegment)
          continue;
      }
    }
    taken[t] = taken[a] = true;
    pairs.emplace_back(t, a);
  }
  return pairs;
}

Expected<MemoryPlan> planProgramMemory(const Executable &exe,
                                       const Program &program,
                                       int64_t alignment, bool viewReshapes) {
  if (alignment < 1 || (alignment & (alignment - 1)) != 0)
    return Status::error("memory alignment must be a power of two, got " +
                         std::to_string(alignment));
  size_t numValues = exe.values.size();
  int64_t n = int64_t(program.instrs.size());
  std::vector<bool> held(numValues, false);
  std::vector<int64_t> defAt(numValues, -1), lastUse(numValues, -1);
  auto badId = [&](int64_t i, int32_t id) {
    return Status::error("instruction " + std::to_string(i) + " ('" +
                         program.instrs[i].op + "') refers to value id " +
                         std::to_string(id) + ", out of range");
  };
  for (int64_t i = 0; i < n; ++i) {
    const Instr &in = program.instrs[i];
    for (int32_t id : in.operands) {
      if (id < 0 || size_t(id) >= numValues)
        return badId(i, id);
      if (exe.values[id].kind == ValueKind::Temp && defAt[id] < 0)
        return Status::error("instruction " + std::to_string(i) + " ('" +
                             in.op + "') reads %" + std::to_string(id) +
                             " before it is defined" +
                             definedElsewhere(exe, program, id));
      held[id] = true;
      lastUse[id] = i;
    }
    for (int32_t id : in.results) {
      if (id < 0 || size_t(id) >= numValues)
        return badId(i, id);
      if (defAt[id] >= 0)
        return Status::error("instruction " + std::to_string(i) + " ('" +
                             in.op + "') redefines %" + std::to_string(id));
      held[id] = true;
      defAt[id] = i;
      lastUse[id] = i;
    }
  }
  for (int32_t id : exe.outputs) {
    if (id < 0 || size_t(id) >= numValues)
      return Status::error("output value id " + std::to_string(id) +
                           " out of range");
    if (exe.values[id].kind != ValueKind::Temp)
      held[id] = true;
    else if (defAt[id] >= 0)
      lastUse[id] = n;
  }
  if (exe.programs.size() <= 1) { // one role: every rank holds every argument
    for (int32_t id : exe.params)
      if (id >= 0 && size_t(id) < numValues)
        held[id] = true;
    for (int32_t id : exe.inputs)
      if (id >= 0 && size_t(id) < numValues)
        held[id] = true;
    for (int32_t id : exe.states)
      if (id >= 0 && size_t(id) < numValues)
        held[id] = true;
  }

  MemoryPlan plan;
  plan.alignment = alignment;
  plan.offsets.assign(numValues, -1);
  int64_t cursor = 0;
  std::vector<BufferLifetime> temps;
  std::vector<size_t> tempIds;
  std::vector<std::pair<int32_t, int32_t>> inPlace =
      findInPlaceUpdates(exe, program);
  std::vector<bool> aliased(numValues, false);
  for (auto [t, a] : inPlace)
    aliased[t] = held[a];
  for (size_t v = 0; v < numValues; ++v) {
    if (!held[v] || aliased[v])
      continue;
    if (exe.values[v].kind != ValueKind::Temp) {
      cursor = alignUp(cursor, alignment);
      plan.offsets[v] = cursor;
      cursor += exe.values[v].type.byteSize();
    } else {
      temps.push_back({exe.values[v].type.byteSize(), defAt[v], lastUse[v]});
      tempIds.push_back(v);
    }
  }
  plan.persistentBytes = alignUp(cursor, alignment);
  // A reshape's result shares its operand's bytes (a view, no copy) when
  // both are temporaries of this program that nothing else aliases: the
  // operand is never written after its definition, so the two names read
  // the same bytes, and the shared buffer lives from the operand's
  // definition to the last use of either. Chains of reshapes share one
  // buffer. Outputs keep their own bytes.
  std::vector<int32_t> viewOf(numValues, -1); // result -> root operand
  if (viewReshapes) {
    std::vector<bool> isOutput(numValues, false), inPlaceValue(numValues, false);
    for (int32_t id : exe.outputs)
      isOutput[size_t(id)] = true;
    for (auto [t, a] : inPlace)
      inPlaceValue[size_t(t)] = inPlaceValue[size_t(a)] = true;
    auto viewable = [&](int32_t id) {
      return exe.values[size_t(id)].kind == ValueKind::Temp &&
             held[size_t(id)] && !aliased[size_t(id)] &&
             !inPlaceValue[size_t(id)] && !isOutput[size_t(id)] &&
             defAt[size_t(id)] >= 0;
    };
    for (const Instr &in : program.instrs) {
      if (in.op != "reshape" || in.operands.size() != 1 ||
          in.results.size() != 1)
        continue;
      int32_t x = in.operands[0], y = in.results[0];
      if (!viewable(x) || !viewable(y) ||
          exe.values[size_t(x)].type.byteSize() !=
              exe.values[size_t(y)].type.byteSize())
        continue;
      int32_t root = viewOf[size_t(x)] >= 0 ? viewOf[size_t(x)] : x;
      viewOf[size_t(y)] = root;
    }
  }
  {
    std::vector<int64_t> until(numValues, -1);
    for (size_t v = 0; v < numValues; ++v)
      if (viewOf[v] >= 0)
        until[size_t(viewOf[v])] =
            std::max(until[size_t(viewOf[v])], lastUse[v]);
    std::vector<BufferLifetime> kept;
    std::vector<size_t> keptIds;
    for (size_t t = 0; t < temps.size(); ++t) {
      size_t id = tempIds[t];
      if (viewOf[id] >= 0)
        continue;
      BufferLifetime b = temps[t];
      b.lastUse = std::max(b.lastUse, until[id]);
      kept.push_back(b);
      keptIds.push_back(id);
    }
    temps = std::move(kept);
    tempIds = std::move(keptIds);
  }
  MemoryAssignment scratch = planMemory(temps, alignment);
  for (size_t t = 0; t < temps.size(); ++t)
    plan.offsets[tempIds[t]] = plan.persistentBytes + scratch.offsets[t];
  plan.scratchBytes = scratch.peakBytes;
  for (size_t v = 0; v < numValues; ++v)
    if (viewOf[v] >= 0)
      plan.offsets[v] = plan.offsets[size_t(viewOf[v])];
  for (auto [t, a] : inPlace)
    if (aliased[t])
      plan.offsets[t] = plan.offsets[a];
  return plan;
}

} // namespace dlopt::rt
