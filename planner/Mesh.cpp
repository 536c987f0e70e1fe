//===- Mesh.cpp - The device mesh of a plan and its rank geometry ---------===//
#include "planner/Mesh.h"

#include "planner/Cluster.h"

#include <limits>
#include <map>
#include <set>

namespace dlopt::planner {

Expected<Mesh> Mesh::make(std::vector<MeshAxis> axes) {
  if (axes.empty())
    return Status::error("a mesh needs at least one axis");
  std::set<std::string> names;
  int64_t product = 1;
  for (const MeshAxis &a : axes) {
    if (a.name.empty())
      return Status::error("mesh axis names must not be empty");
    if (!names.insert(a.name).second)
      return Status::error("mesh axis '" + a.name + "' appears twice");
    if (a.size < 1)
      return Status::error("mesh axis '" + a.name + "' has size " +
                           std::to_string(a.size) + ", expected >= 1");
    product *= a.size;
    if (product > std::numeric_limits<int>::max())
      return Status::error("the mesh has more than 2^31 - 1 devices");
  }
  return Mesh(std::move(axes));
}

Mesh Mesh::standard(int pp, int dp, int cp, int tp) {
  return Mesh({{"pp", pp}, {"dp", dp}, {"cp", cp}, {"tp", tp}});
}

int Mesh::numDevices() const {
  int n = 1;
  for (const MeshAxis &a : axes_)
    n *= a.size;
  return n;
}

std::optional<int> Mesh::axisIndex(std::string_view name) const {
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].name == name)
      return int(i);
  return std::nullopt;
}

int Mesh::size(std::string_view name) const {
  auto i = axisIndex(name);
  return i ? axes_[*i].size : 1;
}

std::vector<int> Mesh::coords(int rank) const {
  std::vector<int> c(axes_.size(), 0);
  for (size_t i = axes_.size(); i-- > 0;) {
    c[i] = rank % axes_[i].size;
    rank /= axes_[i].size;
  }
  return c;
}

int Mesh::coord(int rank, std::string_view name) const {
  auto i = axisIndex(name);
  return i ? coords(rank)[*i] : 0;
}

int Mesh::linearRank(const std::vector<int> &c) const {
  int r = 0;
  for (size_t i = 0; i < axes_.size(); ++i)
    r = r * axes_[i].size + (i < c.size() ? c[i] : 0);
  return r;
}

std::vector<int> Mesh::group(int rank,
                             const std::vector<std::string> &axes) const {
  std::vector<int> base = coords(rank);
  std::vector<int> idx;
  for (const std::string &a : axes)
    if (auto i = axisIndex(a))
      idx.push_back(*i);
  int count = 1;
  for (int i : idx)
    count *= axes_[i].size;
  std::vector<int> out;
  out.reserve(count);
  // Odometer over the group's axes, the first listed axis major.
  std::vector<int> c = base;
  for (int i : idx)
    c[i] = 0;
  for (int k = 0; k < count; ++k) {
    out.push_back(linearRank(c));
    for (size_t j = idx.size(); j-- > 0;) {
      if (++c[idx[j]] < axes_[idx[j]].size)
        break;
      c[idx[j]] = 0;
    }
  }
  return out;
}

std::vector<std::vector<int>>
Mesh::groups(const std::vector<std::string> &axes) const {
  std::vector<std::vector<int>> out;
  const int n = numDevices();
  std::vector<bool> seen(n, false);
  for (int r = 0; r < n; ++r) {
    if (seen[r])
      continue;
    std::vector<int> g = group(r, axes);
    for (int m : g)
      seen[m] = true;
    out.push_back(std::move(g));
  }
  return out;
}

std::string Mesh::str() const {
  std::string s;
  for (const MeshAxis &a : axes_)
    s += (s.empty() ? "" : " ") + a.name + "=" + std::to_string(a.size);
  return s;
}

std::string Mesh::rankFormula() const {
  // ((a0_index*a1 + a1_index)*a2 + a2_index)*a3 + a3_index
  if (axes_.empty())
    return "rank = 0";
  std::string e = axes_[0].name + "_index";
  for (size_t i = 1; i < axes_.size(); ++i) {
    std::string term = e + "*" + axes_[i].name + " + " + axes_[i].name +
                       "_index";
    e = i + 1 < axes_.size() ? "(" + term + ")" : term;
  }
  return "rank = " + e;
}

RankCoords rankCoords(const Mesh &mesh, int rank) {
  RankCoords c;
  c.stage = mesh.coord(rank, "pp");
  c.dp = mesh.coord(rank, "dp");
  c.cp = mesh.coord(rank, "cp");
  c.tp = mesh.coord(rank, "tp");
  return c;
}

int processOf(const Cluster &cluster, ProcessLayout layout, int rank) {
  if (layout == ProcessLayout::BetweenGraph)
    return rank;
  auto loc = cluster.locate(rank);
  return loc ? loc->node : -1;
}

} // namespace dlopt::planner
