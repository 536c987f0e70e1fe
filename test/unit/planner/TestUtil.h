//===- TestUtil.h - Helpers shared by the planner tests -------------------===//
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <string>

namespace dlopt::planner::test {

/// Writes `text` to a fresh file under the gtest temp dir; returns its path.
inline std::string writeTemp(const std::string &name, const std::string &text) {
  std::string path = ::testing::TempDir() + "dlopt_planner_" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

/// |a - b| <= rel * |b|, printed with both values on failure.
#define EXPECT_REL(a, b, rel)                                                  \
  EXPECT_NEAR((a), (b), (rel)*std::abs(static_cast<double>(b)))

} // namespace dlopt::planner::test
