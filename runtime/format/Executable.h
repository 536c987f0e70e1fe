//===- Executable.h - The in-memory form of a dlopt plan file ------------===//
//
// An Executable is what `dlopt-compile` produces and `dlopt-run` executes:
// a table of typed values, one instruction stream per rank, and a memory plan
// that gives every value an offset in that rank's arena. The on-disk encoding
// is documented in docs/executable-format.md and implemented in
// ExecutableIO.cpp. This header is shared with the compiler, so it depends on
// the standard library only.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/support/DType.h"
#include "runtime/support/Status.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace dlopt::rt {

/// Current on-disk format version. Bump on any incompatible change.
inline constexpr uint32_t kExecutableFormatVersion = 3;

/// A tensor type: element type plus static shape (rank 0 = scalar).
struct TensorType {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;

  int64_t numElements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t byteSize() const { return numElements() * dtypeSize(dtype); }
  bool operator==(const TensorType &o) const {
    return dtype == o.dtype && shape == o.shape;
  }
  /// "4x8xf32" style, as in MLIR's tensor types.
  std::string str() const;
};

/// How a parameter is initialized when no value is bound for it.
/// dist: "zeros", "ones", "constant" (value), "normal" (mean, std),
/// "truncated_normal" (mean, std, cut at 2 std), "uniform" (low, high).
struct Init {
  std::string dist = "zeros";
  double mean = 0.0, std = 1.0, low = 0.0, high = 1.0, value = 0.0;
  bool operator==(const Init &o) const {
    return dist == o.dist && mean == o.mean && std == o.std &&
           low == o.low && high == o.high && value == o.value;
  }
};

/// What a value is, which decides where it lives and who fills it.
enum class ValueKind : uint8_t {
  Param = 0, ///< model parameter: bound by name or initialized from `init`
  Input = 1, ///< model input: bound by name (e.g. from .npy) before running
  Const = 2, ///< constant: bytes stored in the executable's constant blob
  Temp = 3,  ///< produced by an instruction
  State = 4, ///< training state (optimizer moments, step count, loss scale):
             ///< persistent like a param, initialized from `init`
             ///< (zeros unless stated), saved in checkpoints
};

/// How a value of a multi-rank executable relates to its global tensor:
/// `type` is the global type and `split[d]` lists the mesh axes (indices
/// into Mesh::axes, major first) dim d is split over, evenly. The local type
/// is the global one with each split dim divided by the product of its axes'
/// sizes. Ranks that share coordinates on every split axis hold the same
/// part.
struct GlobalLayout {
  TensorType type;
  std::vector<std::vector<int32_t>> split;
  bool operator==(const GlobalLayout &o) const {
    return type == o.type && split == o.split;
  }
};

/// One SSA value of the program.
struct Value {
  std::string name;   ///< argument/output name, or empty for temporaries
  TensorType type;
  ValueKind kind = ValueKind::Temp;
  Init init;                 ///< only for Param
  int64_t constOffset = -1;  ///< only for Const: byte offset into constData
  /// Only for Const: constData holds one element, repeated over the type
  /// (a splat stays one element through the format, whatever its size).
  bool constSplat = false;
  /// Params, inputs, states and outputs of a multi-rank executable that are
  /// split over the mesh: their global tensor. Absent: every rank holds the
  /// whole tensor (the local type is the global one).
  std::optional<GlobalLayout> global;
  bool operator==(const Value &o) const {
    return name == o.name && type == o.type && kind == o.kind &&
           init == o.init && constOffset == o.constOffset &&
           constSplat == o.constSplat && global == o.global;
  }
  /// Bytes of constData a Const value occupies.
  int64_t constBytes() const {
    return constSplat ? dtypeSize(type.dtype) : type.byteSize();
  }
};

/// Instruction attribute values. Booleans are stored as int64 0/1.
using AttrValue = std::variant<int64_t, double, std::string,
                               std::vector<int64_t>, std::vector<double>>;

/// One instruction: an op name (the dlopt mnemonic without the dialect
/// prefix, e.g. "matmul") applied to operand values, defining result values.
struct Instr {
  std::string op;
  std::vector<int32_t> operands; ///< indices into Executable::values
  std::vector<int32_t> results;  ///< indices into Executable::values
  std::map<std::string, AttrValue> attrs;
  int32_t layer = -1;  ///< dlopt.layer mark of the source op, -1 if none
  std::string loc;     ///< source location, "file:line:col", for diagnostics

  bool operator==(const Instr &o) const {
    return op == o.op && operands == o.operands && results == o.results &&
           attrs == o.attrs && layer == o.layer && loc == o.loc;
  }

  bool hasAttr(const std::string &name) const { return attrs.count(name); }
  /// Typed attribute lookups; a missing or mistyped attribute is an error
  /// naming the instruction and the attribute.
  Expected<int64_t> getInt(const std::string &name) const;
  Expected<double> getFloat(const std::string &name) const; // accepts ints
  Expected<std::string> getString(const std::string &name) const;
  Expected<std::vector<int64_t>> getInts(const std::string &name) const;
  /// Lookups with a default used when the attribute is absent.
  int64_t getInt(const std::string &name, int64_t dflt) const;
  double getFloat(const std::string &name, double dflt) const;
  bool getBool(const std::string &name, bool dflt) const;
};

/// Where each value lives in a rank's arena. The arena is one allocation:
/// persistent values (params, inputs, consts) first, then the scratch region
/// reused by temporaries according to their liveness.
struct MemoryPlan {
  int64_t alignment = 64;
  int64_t persistentBytes = 0; ///< params + inputs + consts
  int64_t scratchBytes = 0;    ///< peak of simultaneously live temporaries
  int64_t totalBytes() const { return persistentBytes + scratchBytes; }
  /// Byte offset of each value in the arena, indexed like
  /// Executable::values; -1 for values this rank does not hold.
  std::vector<int64_t> offsets;
  bool operator==(const MemoryPlan &o) const {
    return alignment == o.alignment && persistentBytes == o.persistentBytes &&
           scratchBytes == o.scratchBytes && offsets == o.offsets;
  }
};

/// The instruction stream of one rank (one device).
struct Program {
  /// The ranks that run this program (one program per rank role: ranks
  /// that do the same thing share one).
  std::vector<int32_t> ranks{0};
  std::vector<Instr> instrs;
  MemoryPlan memory;
  bool operator==(const Program &o) const {
    return ranks == o.ranks && instrs == o.instrs && memory == o.memory;
  }
};

/// The device mesh: named axes, major first; rank r has the row-major
/// coordinates of r (the last axis varies fastest). A single-rank
/// executable has no axes.
struct Mesh {
  std::vector<std::string> axes;
  std::vector<int64_t> shape;
  int64_t size() const {
    int64_t n = 1;
    for (int64_t s : shape)
      n *= s;
    return n;
  }
  /// Coordinates of `rank`, one per axis.
  std::vector<int64_t> coords(int64_t rank) const;
  bool operator==(const Mesh &o) const {
    return axes == o.axes && shape == o.shape;
  }
};

/// A kind of communicator: the ranks that share their coordinates on every
/// mesh axis outside `axes` form one group, ordered by their coordinates on
/// `axes` (row-major). Communication instructions name a group by its index
/// in Executable::groups.
struct CommGroup {
  std::string name;           ///< "dp", "tp", "dp+cp"
  std::vector<int32_t> axes;  ///< indices into Mesh::axes, increasing
  bool operator==(const CommGroup &o) const {
    return name == o.name && axes == o.axes;
  }
};

/// Communication instructions (docs/executable-format.md): every one has an
/// int attribute `group`.
///   all_reduce     {reduce: sum|max|min|avg}  result = operand's type
///   all_gather     {axis}      result dim `axis` = operand's * group size
///   reduce_scatter {axis, reduce}  result dim `axis` = operand's / size
///   all_to_all     {split_axis, concat_axis}
///   broadcast      {root}      root: index in the group
bool isCommunicationOp(const std::string &op);

/// What the planner predicted for the step a plan file runs (written when
/// dlopt-compile applies a plan; dlopt-run prints it beside the measured
/// figures).
struct Prediction {
  std::string cluster;     ///< the cluster the plan was priced on
  double stepSeconds = 0;  ///< one training step
  double memoryBytes = 0;  ///< per device, the largest stage
  bool operator==(const Prediction &o) const {
    return cluster == o.cluster && stepSeconds == o.stepSeconds &&
           memoryBytes == o.memoryBytes;
  }
};

/// A compiled model: what a plan file holds.
struct Executable {
  uint32_t version = kExecutableFormatVersion;
  std::string modelName;  ///< e.g. the source function's name
  std::string source;     ///< the model file it was compiled from
  int32_t worldSize = 1;
  std::vector<Value> values;
  std::vector<int32_t> params;  ///< value ids, in function-argument order
  std::vector<int32_t> inputs;  ///< value ids, in function-argument order
  std::vector<int32_t> states;  ///< value ids, in function-argument order
  std::vector<int32_t> outputs; ///< value ids, in function-result order
  std::vector<std::string> outputNames;
  /// Parallel to `outputs`: the name of the param or state whose buffer this
  /// output replaces after each step (a training step's new weights and
  /// optimizer state), or empty. Training loops copy these back (or the
  /// memory plan aliases them) so step N+1 sees step N's updates.
  std::vector<std::string> outputUpdates;
  std::vector<uint8_t> constData;
  Mesh mesh;                     ///< empty for a single rank
  std::vector<CommGroup> groups;
  /// One per rank role; every rank in [0, worldSize) runs exactly one.
  std::vector<Program> programs;
  std::optional<Prediction> prediction;

  bool operator==(const Executable &o) const {
    return version == o.version && modelName == o.modelName &&
           source == o.source && worldSize == o.worldSize &&
           values == o.values && params == o.params && inputs == o.inputs &&
           states == o.states && outputs == o.outputs &&
           outputNames == o.outputNames && outputUpdates == o.outputUpdates &&
           constData == o.constData && mesh == o.mesh && groups == o.groups &&
           programs == o.programs && prediction == o.prediction;
  }

  /// Index of the program `rank` runs, or -1.
  int32_t programOf(int32_t rank) const;
  /// The ranks of the group of kind `group` that contains `rank`, in group
  /// order (the index of `rank` in it is its rank in the communicator).
  std::vector<int32_t> groupRanks(int32_t group, int32_t rank) const;
  /// The number of ranks in a group of kind `group`.
  int64_t groupSize(int32_t group) const;
  /// groupRanks(group, rank)[index], without listing the group.
  int32_t groupMember(int32_t group, int32_t rank, int64_t index) const;

  /// Checks internal consistency (ids in range, each Temp defined once and
  /// before use, memory plan covering every value, no overlapping live
  /// buffers). Readers call it so a hand-edited or corrupt file is rejected.
  Status validate() const;
};

/// For a temporary `id` that `self` reads without defining it: where another
/// program defines it, as " (defined by program K on ranks ...; a value
/// another pipeline stage computes must arrive by send/recv)"; empty when no
/// program does.
std::string definedElsewhere(const Executable &exe, const Program &self,
                             int32_t id);

/// Serializes to / parses from the on-disk encoding (docs/executable-format.md).
Expected<std::vector<uint8_t>> serializeExecutable(const Executable &exe);
Expected<Executable> deserializeExecutable(const std::vector<uint8_t> &bytes);
Status writeExecutable(const Executable &exe, const std::string &path);
Expected<Executable> readExecutable(const std::string &path);

/// Human-readable listing for `dlopt-run --dump`.
std::string dumpExecutable(const Executable &exe);

/// "1.50 MiB" style, for reports.
std::string formatBytes(int64_t bytes);

/// Parses the TensorType::str() spelling ("4x8xf32", "f32" for a scalar).
Expected<TensorType> parseTensorType(const std::string &text);

/// Lower-case name of a value kind ("param", "input", "const", "temp").
const char *valueKindName(ValueKind kind);

/// Size of the fixed file header that precedes the payload.
inline constexpr size_t kExecutableHeaderSize = 32;

/// FNV-1a 64-bit hash, the payload checksum of the on-disk format.
uint64_t fnv1a64(const uint8_t *data, size_t size);

} // namespace dlopt::rt
