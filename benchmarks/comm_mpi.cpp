//===- comm_mpi.cpp - The MPI communicator against MPI_Allreduce ----------===//
//
// Run under mpirun (scripts/bench-mpi.sh):
//
//   mpirun -n 4 --oversubscribe build/bin/dlopt-bench-mpi [MiB] [reps]
//
// Times a float32 sum all-reduce of MiB (default 64) through dlopt's
// MpiCommunicator (rank-order, deterministic: all-to-all of chunks, reduce,
// all-gather) and through OpenMPI's own MPI_Allreduce on the same buffers in
// the same run, alternating, and prints the best and median of each.
//
//===----------------------------------------------------------------------===//

#include "runtime/comm/MpiCommunicator.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

using namespace dlopt::rt;

int main(int argc, char **argv) {
  auto info = initMpi(&argc, &argv);
  if (!info) {
    std::fprintf(stderr, "%s\n", info.status().message().c_str());
    return 1;
  }
  double mib = argc > 1 ? std::atof(argv[1]) : 64;
  int reps = argc > 2 ? std::atoi(argv[2]) : 7;
  auto comm = createMpiWorld();
  if (!comm) {
    std::fprintf(stderr, "%s\n", comm.status().message().c_str());
    return 1;
  }
  const int64_t n = int64_t(mib * (1 << 20) / 4);
  std::vector<float> in(static_cast<size_t>(n)), out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    in[size_t(i)] = float(i % 1000) * 0.001f + float(info->worldRank);
  std::vector<double> ours, theirs;
  for (int r = 0; r < reps + 1; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = std::chrono::steady_clock::now();
    Status st = (*comm)->allReduce(hostIn(in.data(), n, DType::F32),
                                   hostOut(out.data(), n, DType::F32),
                                   ReduceOp::Sum);
    double a = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                             t0)
                   .count();
    if (!st) {
      std::fprintf(stderr, "%s\n", st.message().c_str());
      return 1;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = std::chrono::steady_clock::now();
    MPI_Allreduce(in.data(), out.data(), int(n), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    double b = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                             t0)
                   .count();
    if (r > 0) { // the first round warms up
      ours.push_back(a);
      theirs.push_back(b);
    }
  }
  // The slowest rank decides each time.
  std::vector<double> oursMax(ours.size()), theirsMax(theirs.size());
  MPI_Reduce(ours.data(), oursMax.data(), int(ours.size()), MPI_DOUBLE,
             MPI_MAX, 0, MPI_COMM_WORLD);
  MPI_Reduce(theirs.data(), theirsMax.data(), int(theirs.size()), MPI_DOUBLE,
             MPI_MAX, 0, MPI_COMM_WORLD);
  if (info->worldRank == 0) {
    std::sort(oursMax.begin(), oursMax.end());
    std::sort(theirsMax.begin(), theirsMax.end());
    auto med = [](const std::vector<double> &v) { return v[v.size() / 2]; };
    std::printf("all-reduce of %.0f MiB float32 over %d processes, %d runs "
                "(ms, best / median)\n",
                mib, info->worldSize, reps);
    std::printf("  dlopt MpiCommunicator : %8.1f / %8.1f\n", oursMax[0] * 1e3,
                med(oursMax) * 1e3);
    std::printf("  MPI_Allreduce         : %8.1f / %8.1f\n",
                theirsMax[0] * 1e3, med(theirsMax) * 1e3);
    std::printf("  ratio (median)        : %8.2fx\n",
                med(oursMax) / med(theirsMax));
  }
  comm->reset();
  finalizeMpi();
  return 0;
}
