//===- MpiCommunicator.h - Ranks as processes, over MPI ------------------===//
//
// Between-graph execution on the CPU: one process per rank (or per group of
// in-process ranks), started by mpirun or srun, exchanging host buffers over
// MPI (Debian's OpenMPI). It keeps the Communicator contract of
// InProcessCommunicator, so a job gives the same bits whatever its layout:
//
//  - every reduction runs in rank order through RankOrderReduce.h (an
//    all-reduce is an all-to-all of chunks, each chunk reduced by its owner
//    in rank order, then an all-gather), never through MPI's own reduction
//    order;
//  - before each collective the ranks exchange what they are about to do
//    (operation, counts, element type, root), so a mismatch is an error on
//    every rank instead of corrupt memory;
//  - no call waits forever: every MPI request is polled against the
//    communicator's timeout, and a timeout (or abort()) fails the call with
//    a message naming the operation, the group and this rank. The job-level
//    policy (a failed rank ends the job, naming itself) is dlopt-run's.
//
// MPI must be initialized with MPI_THREAD_MULTIPLE when several threads of
// one process use communicators concurrently (hybrid layouts);
// initMpi() asks for it and says what the library granted.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/comm/Communicator.h"

#include <memory>
#include <vector>

namespace dlopt::rt {

/// What MPI_Init_thread granted.
struct MpiInfo {
  int worldRank = 0;
  int worldSize = 1;
  bool threadMultiple = false; ///< several threads may call MPI at once
};

/// Initializes MPI once per process (later calls return the same info).
/// The communicator it duplicates for job-abort notices is created with a
/// bounded wait (`startupTimeout`): a process stopped or gone after
/// MPI_Init makes the others fail with a message instead of hanging. (A
/// process that never reaches MPI_Init is the launcher's to time out.)
Expected<MpiInfo> initMpi(int *argc, char ***argv,
                          std::chrono::milliseconds startupTimeout =
                              kDefaultCommTimeout);
/// Whether this process was started by an MPI launcher (mpirun, srun):
/// checks the launchers' environment variables, without initializing MPI.
bool launchedByMpi();
/// Finalizes MPI if initMpi() initialized it.
void finalizeMpi();

struct MpiOptions {
  std::chrono::milliseconds timeout = kDefaultCommTimeout;
};

/// This process's communicator over every process of the job
/// (MPI_COMM_WORLD, duplicated; the duplication waits at most
/// opts.timeout for the other processes). initMpi() must have succeeded.
Expected<std::unique_ptr<Communicator>> createMpiWorld(MpiOptions opts = {});

/// Hybrid layouts: this process's communicators (element i is rank
/// P * ranksPerProcess + i, P this process's index) over a world of
/// (processes x ranksPerProcess) ranks, each process running its ranks as
/// threads. Groups split from them whose ranks all live in one process are
/// in-process groups; the others exchange point-to-point MPI messages.
/// Reductions are in rank order, as everywhere. Needs MPI_THREAD_MULTIPLE.
Expected<std::vector<std::unique_ptr<Communicator>>>
createHybridWorld(int ranksPerProcess, MpiOptions opts = {});

// Ending the job when a process fails (docs/launch.md). The failing process
// calls notifyJobAbort(reason): every other process's pending and later MPI
// communicator calls then fail with "aborted: REASON" (each names the call
// it was waiting in), and those processes acknowledge with
// acknowledgeJobAbort() once they have reported, which the failing process
// awaits (bounded) before it exits, so every message reaches the log before
// the launcher tears the job down.

/// Sends `reason` to every other process (once per process; later calls do
/// nothing). Safe to call from any thread.
void notifyJobAbort(const std::string &reason);
/// Whether another process's notice arrived (polling MPI for it); its
/// reason in *reason.
bool jobAborted(std::string *reason = nullptr);
/// After a notice: tells the process that sent it that this one reported.
void acknowledgeJobAbort();
/// After notifyJobAbort: waits until every other process acknowledged or
/// `timeout` passed; returns how many did.
int awaitJobAbortAcks(std::chrono::milliseconds timeout);

/// What a thread of this process is waiting for in MPI right now
/// ("all_reduce (rank 1 of a group of 4, MPI)"), or null; async-signal-safe
/// to read (for a SIGTERM handler that says what the process was doing).
const char *mpiWaitNote();

} // namespace dlopt::rt
