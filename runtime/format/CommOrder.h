//===- CommOrder.h - Proof that a multi-rank executable cannot deadlock ----===//
//
// Every rank runs its program's instructions in order; communication
// instructions wait for other ranks. checkCommunicationOrder replays the
// communication of every rank, assuming the worst a backend may do (a send
// blocks until its receive starts, as NCCL's may; a collective blocks until
// every rank of its group reaches it), and proves that
//   - every send meets a receive from the same rank, of the same type, and
//     every receive a send,
//   - the k-th collective of each communicator is the same operation (op,
//     attributes, operand type) on every rank of it,
//   - the ranks cannot wait for each other in a cycle, nor for a rank that
//     has finished.
// Executable::validate runs it, so a broken pairing or a schedule that can
// hang is refused when the executable is read or written, before any rank
// starts. The cost is linear in the communication instructions of all ranks
// plus the sizes of the groups.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/format/Executable.h"

namespace dlopt::rt {

/// Checks the executable's communication as above. Expects an executable
/// whose programs, groups and instructions are otherwise valid (ids in
/// range, `group` and `peer` attributes checked).
Status checkCommunicationOrder(const Executable &exe);

} // namespace dlopt::rt
